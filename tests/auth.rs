//! API-key authentication (issue 6, item 4).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::Value;

const KEYS: &str = "key-one,key-two";

fn with_auth(home: &Home, args: &[&str], allow_localhost: &str, key: Option<&str>) -> std::process::Output {
    let mut command = home.cmd(args);
    command
        .env("SYNAPSE_AUTH_ENABLED", "true")
        .env("SYNAPSE_API_KEYS", KEYS)
        .env("SYNAPSE_ALLOW_LOCALHOST", allow_localhost);
    match key {
        Some(key) => command.env("SYNAPSE_API_KEY", key),
        // The broker already runs with its keys; this CLI has none.
        None => command.env("SYNAPSE_API_KEY", "").env_remove("SYNAPSE_API_KEYS"),
    };
    command.output().unwrap()
}

#[test]
fn with_localhost_refused_every_protected_endpoint_needs_a_valid_key() {
    let home = Home::new();
    let started = with_auth(&home, &["broker", "start"], "false", Some("key-one"));
    assert!(started.status.success(), "{}", describe(&started));
    let registered = with_auth(
        &home,
        &[
            "agent",
            "register",
            "--type",
            "dummy",
            "--pid",
            &std::process::id().to_string(),
            "--port",
            "0",
            "--name",
            "bob",
        ],
        "false",
        Some("key-two"),
    );
    assert!(registered.status.success(), "{}", describe(&registered));
    let bob: Value = serde_json::from_slice(&registered.stdout).unwrap();
    let agent_port = u16::try_from(bob["agent"]["port"].as_u64().unwrap()).unwrap();
    let port = broker_port(&home);
    let send = br#"{"to":"bob","text":"hi"}"#;
    let message = br#"{"message":{"role":"user","parts":[{"type":"text","text":"hi"}]}}"#;
    let protected: Vec<(u16, &str, &str, Option<&[u8]>)> = vec![
        (port, "GET", "/agents", None),
        (port, "POST", "/send", Some(send)),
        (port, "GET", "/events", None),
        (port, "POST", "/admin/verify", None),
        (port, "GET", "/tasks/abcd", None),
        (port, "POST", "/reply", Some(br#"{"from":"bob","text":"x"}"#)),
        (agent_port, "POST", "/tasks/send", Some(message)),
        (agent_port, "GET", "/tasks", None),
        (agent_port, "GET", "/reply-stack/list", None),
    ];
    for (port, method, path, body) in &protected {
        let (status, answer) = http_tcp(*port, method, path, *body, &[]);
        assert_eq!(status, 401, "{method} {path}: {answer}");
        assert_eq!(answer["message"], "API key required");
        let (status, answer) = http_tcp(*port, method, path, *body, &[("X-API-Key", "wrong")]);
        assert_eq!(status, 401, "{method} {path}: {answer}");
        assert_eq!(answer["message"], "Invalid API key");
        let (status, answer) = http_tcp(*port, method, path, *body, &[("Authorization", "Bearer key-two")]);
        assert_ne!(status, 401, "{method} {path}: {answer}");
    }
    // Over the Unix socket too, since localhost is not trusted.
    let (status, _) = home.http("GET", "/agents", None, &[]);
    assert_eq!(status, 401);
    let (status, _) = home.http("GET", "/agents", None, &[("X-API-Key", "key-one")]);
    assert_eq!(status, 200);
    // Cards and status stay open.
    for path in ["/.well-known/agent.json", "/status"] {
        let (status, answer) = http_tcp(agent_port, "GET", path, None, &[]);
        assert_eq!(status, 200, "{path}: {answer}");
    }
    // Issue 15: the public card says how to authenticate and that an extended card exists; the
    // extended card (JSON-RPC GetExtendedAgentCard, or GET /v1/extendedAgentCard) needs a key.
    let (_, card) = http_tcp(agent_port, "GET", "/.well-known/agent-card.json", None, &[]);
    assert_eq!(card["capabilities"]["extendedAgentCard"], true, "{card}");
    assert_eq!(card["securitySchemes"]["apiKey"]["apiKeySecurityScheme"]["name"], "X-API-Key", "{card}");
    assert!(card["capabilities"].get("extensions").is_none(), "nothing more in the public card");
    let call = br#"{"jsonrpc":"2.0","id":1,"method":"GetExtendedAgentCard","params":{}}"#;
    let v1 = [("A2A-Version", "1.0")];
    let (status, _) = http_tcp(agent_port, "POST", "/", Some(call), &v1);
    assert_eq!(status, 401, "no key, no extended card");
    let (status, answer) =
        http_tcp(agent_port, "POST", "/", Some(call), &[("A2A-Version", "1.0"), ("X-API-Key", "key-one")]);
    assert_eq!(status, 200, "{answer}");
    let params = &answer["result"]["capabilities"]["extensions"][0]["params"];
    assert_eq!(params["agentId"], bob["agent"]["agent_id"], "{answer}");
    let (status, _) = http_tcp(agent_port, "GET", "/v1/extendedAgentCard", None, &v1);
    assert_eq!(status, 401);
    let (status, rest) =
        http_tcp(agent_port, "GET", "/v1/extendedAgentCard", None, &[("A2A-Version", "1.0"), ("X-API-Key", "key-two")]);
    assert_eq!((status, &rest["capabilities"]["extensions"][0]["uri"]), (200, &Value::from("urn:synapse:agent:v1")));
    // The CLI sends its configured key; without one it gets the 401 text.
    assert!(with_auth(&home, &["send", "bob", "hello", "--no-response"], "false", Some("key-one")).status.success());
    let refused = with_auth(&home, &["send", "bob", "hello", "--no-response"], "false", None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("API key required"), "{}", describe(&refused));
}

#[test]
fn requests_from_localhost_pass_without_a_key_by_default() {
    let home = Home::new();
    let started = with_auth(&home, &["broker", "start"], "true", None);
    assert!(started.status.success(), "{}", describe(&started));
    let (status, _) = http_tcp(broker_port(&home), "GET", "/agents", None, &[]);
    assert_eq!(status, 200);
    let (status, _) = home.http("GET", "/agents", None, &[]);
    assert_eq!(status, 200);
}
