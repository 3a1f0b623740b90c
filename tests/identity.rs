//! Trust boundaries of identity (issue 12): an agent registers only as a process it can prove,
//! a live agent's name can't be taken, `synapse stop` signals only Synapse's own wrappers, and
//! agents act only as themselves while the user acts for any.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(30);

/// Starts a background dummy agent (`synapse start`); returns what it announced.
fn start(home: &Home, name: &str) -> Value {
    let output = home.cmd(&["start", "dummy", "--name", name, "--json"]).output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn as_agent(agent: &Value) -> Agent {
    Agent {
        id: agent["agent_id"].as_str().unwrap().to_string(),
        secret: agent["secret"].as_str().unwrap().to_string(),
        port: u16::try_from(agent["port"].as_u64().unwrap()).unwrap(),
        socket: agent["socket"].as_str().unwrap().into(),
    }
}

fn pid_of(agent: &Value) -> u32 {
    u32::try_from(agent["pid"].as_u64().unwrap()).unwrap()
}

/// Stops the started wrappers when the test ends, whatever happens.
struct Wrappers<'a>(&'a Home, Vec<String>);

impl Drop for Wrappers<'_> {
    fn drop(&mut self) {
        for agent in &self.1 {
            let _ = self.0.cmd(&["stop", agent]).output();
        }
    }
}

fn agents(home: &Home) -> Vec<Value> {
    let (status, list) = home.http("GET", "/agents", None, &[]);
    assert_eq!(status, 200, "{list}");
    list["agents"].as_array().unwrap().clone()
}

/// A child process that is not Synapse, killed when dropped.
struct Bystander(std::process::Child);

impl Bystander {
    fn sleep() -> Bystander {
        Bystander(std::process::Command::new("sleep").arg("120").stdin(Stdio::null()).spawn().unwrap())
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    fn is_running(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process that registered itself as an agent (a shell that became `sleep`), as a crashed
/// wrapper would look once killed. Returns it and its registration. An empty `name`
/// registers it without one.
fn self_registered(home: &Home, name: &str, port: u16) -> (Bystander, Value) {
    let registration = home.dir.path().join(format!("{name}-{port}.json"));
    let _ = std::fs::remove_file(&registration);
    let name_flag = if name.is_empty() { String::new() } else { format!("--name {name}") };
    let script = format!(
        "'{BIN}' agent register --type dummy --pid $$ {name_flag} --port {port} > '{path}.part' && mv '{path}.part' '{path}' && exec sleep 120",
        path = registration.display()
    );
    let mut process = Bystander(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .env("SYNAPSE_HOME", home.home())
            .env("SYNAPSE_UDS_DIR", home.uds())
            .env("SYNAPSE_BROKER_PORT", "0")
            .env_remove("SYNAPSE_AGENT_ID")
            .env_remove("SYNAPSE_AGENT_SECRET")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(&registration) {
            return (process, serde_json::from_slice(&bytes).unwrap());
        }
        assert!(process.is_running(), "{name} could not register");
        assert!(started.elapsed() < DEADLINE, "{name} never registered");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the process and waits until the broker has deregistered `agent_id`.
fn crash(home: &Home, mut process: Bystander, agent_id: &str) {
    let _ = process.0.kill();
    let _ = process.0.wait();
    let started = Instant::now();
    while agents(home).iter().any(|agent| agent["agent_id"] == agent_id) {
        assert!(started.elapsed() < DEADLINE, "{agent_id} was never found gone");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn inbox_texts(home: &Home, agent_id: &str) -> Vec<String> {
    let value: Value = serde_json::from_str(&home.ok(&["agent", "inbox", agent_id])).unwrap();
    value["tickets"].as_array().unwrap().iter().map(|ticket| ticket["text"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_crashed_agents_queue_never_reaches_a_new_agent_on_its_port_and_waits_for_it_under_its_name() {
    let home = Home::new();
    home.events(); // starts the broker
    let port = free_port();
    let (bob, registered) = self_registered(&home, "bob", port);
    let bob_id = registered["agent"]["agent_id"].as_str().unwrap().to_string();
    home.ok(&["send", "bob", "first for bob", "--no-response"]);
    home.ok(&["send", "bob", "second for bob", "--no-response"]);
    crash(&home, bob, &bob_id);

    // carol on bob's port: refused with the reason; carol elsewhere gets another id, empty.
    let test_pid = std::process::id().to_string();
    let port_text = port.to_string();
    let on_bobs_port = home
        .run(&["agent", "register", "--type", "dummy", "--pid", &test_pid, "--name", "carol", "--port", &port_text]);
    assert!(!on_bobs_port.status.success(), "{}", describe(&on_bobs_port));
    assert!(stderr(&on_bobs_port).contains("holds 2 pending message(s) of bob"), "{}", describe(&on_bobs_port));
    let carol = home.register(Some("carol"));
    assert_ne!(carol.id, bob_id);
    assert!(inbox_texts(&home, &carol.id).is_empty(), "carol never receives bob's messages");

    // A process inside another agent (here carol's CLI, with carol's secret) can't take bob's
    // name and queue.
    let inside_carol = home
        .run_as(&carol, &["agent", "register", "--type", "dummy", "--pid", &test_pid, "--name", "bob", "--port", "0"]);
    assert!(!inside_carol.status.success(), "{}", describe(&inside_carol));
    assert!(stderr(&inside_carol).contains("only the user takes them back"), "{}", describe(&inside_carol));
    assert_eq!(inbox_texts(&home, &bob_id).len(), 2, "the queue still waits for bob");

    // bob started again with --name bob, on another port, gets his id and queue back.
    let (_bob_again, again) = self_registered(&home, "bob", 0);
    assert_eq!(again["agent"]["agent_id"], bob_id.as_str(), "{again}");
    assert_ne!(again["agent"]["port"].as_u64(), Some(u64::from(port)));
    assert_eq!(inbox_texts(&home, &bob_id), ["first for bob", "second for bob"]);
    // And a message to bob reaches the same inbox.
    home.ok(&["send", "bob", "third for bob", "--no-response"]);
    assert_eq!(inbox_texts(&home, &bob_id).len(), 3);
}

/// An agent started without a name leaves its queue under its id (its type and port): started
/// again on that port, it takes the queue back. That was refused for the queue itself ("they
/// wait for it to start again"), and the messages waited a day to expire. Another agent, named,
/// still cannot take that port's queue, nor can a process inside another agent.
#[test]
fn an_unnamed_agent_started_again_on_its_port_takes_its_queue_back() {
    let home = Home::new();
    home.events(); // starts the broker
    let port = free_port();
    let (first, registered) = self_registered(&home, "", port);
    let id = registered["agent"]["agent_id"].as_str().unwrap().to_string();
    // It asked bob something before it died: the answer must still find it.
    let bob = home.register(Some("bob"));
    let asked = home.run_as(&agent_of(&registered), &["send", "bob", "what is it?", "--response"]);
    assert!(asked.status.success(), "{}", describe(&asked));
    home.ok(&["send", &id, "queued for the unnamed one", "--no-response"]);
    crash(&home, first, &id);

    let test_pid = std::process::id().to_string();
    let port_text = port.to_string();
    let named = home
        .run(&["agent", "register", "--type", "dummy", "--pid", &test_pid, "--name", "carol", "--port", &port_text]);
    assert!(!named.status.success(), "{}", describe(&named));
    assert!(stderr(&named).contains("holds 1 pending message(s)"), "{}", describe(&named));
    let carol = home.register(Some("carol"));
    let inside_carol =
        home.run_as(&carol, &["agent", "register", "--type", "dummy", "--pid", &test_pid, "--port", &port_text]);
    assert!(!inside_carol.status.success(), "{}", describe(&inside_carol));
    assert!(
        stderr(&inside_carol).contains(&format!("start the agent again on port {port}")),
        "{}",
        describe(&inside_carol)
    );

    let (_again, again) = self_registered(&home, "", port);
    assert_eq!(again["agent"]["agent_id"], id.as_str(), "{again}");
    assert_eq!(inbox_texts(&home, &id), ["queued for the unnamed one"]);
    // Taken back, it is the same agent: bob's answer reaches it (it had been kept from it as
    // from another agent that got the id).
    let answered = home.run_as(&bob, &["reply", "it is this"]);
    assert!(answered.status.success(), "{}", describe(&answered));
    assert!(!stderr(&answered).contains("names another agent"), "{}", describe(&answered));
    assert_eq!(inbox_texts(&home, &id), ["queued for the unnamed one", "it is this"]);
}

#[test]
fn a_request_an_agent_received_but_did_not_answer_also_keeps_its_id_from_another_agent() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let port = free_port();
    let (erin, registered) = self_registered(&home, "erin", port);
    let erin_agent = Agent {
        id: registered["agent"]["agent_id"].as_str().unwrap().to_string(),
        secret: registered["secret"].as_str().unwrap().to_string(),
        port,
        socket: registered["socket"].as_str().unwrap().into(),
    };
    let asked = home.run_as(&alice, &["send", "erin", "the password is swordfish; ok?", "--response"]);
    assert!(asked.status.success(), "{}", describe(&asked));
    // Erin's CLI got the message (the ticket is acknowledged) but never answered.
    let ticket = home.inbox(&erin_agent)[0]["ticket"].as_u64().unwrap().to_string();
    let acked = home.run_as(&erin_agent, &["agent", "ack", &erin_agent.id, &ticket]);
    assert!(acked.status.success(), "{}", describe(&acked));
    assert!(home.inbox(&erin_agent).is_empty());
    crash(&home, erin, &erin_agent.id);

    let test_pid = std::process::id().to_string();
    let port_text = port.to_string();
    let taken = home
        .run(&["agent", "register", "--type", "dummy", "--pid", &test_pid, "--name", "mallory", "--port", &port_text]);
    assert!(!taken.status.success(), "mallory would see erin's reply stack: {}", describe(&taken));
    let (_erin_again, again) = self_registered(&home, "erin", 0);
    assert_eq!(again["agent"]["agent_id"], erin_agent.id.as_str(), "{again}");
    let (status, target) = home.http("GET", &format!("/agents/{}/reply-stack/get", erin_agent.id), None, &[]);
    assert_eq!(status, 200, "erin can still answer alice: {target}");
    assert_eq!(target["sender_id"], alice.id.as_str());
}

#[test]
fn a_queue_nobody_takes_back_expires_with_a_visible_reason_and_frees_the_id() {
    let home = Home::new();
    let started = home.cmd(&["events", "--json"]).env("SYNAPSE_INBOX_HOLD_SECONDS", "1").output().unwrap();
    assert!(started.status.success(), "{}", describe(&started));
    let alice = home.register(Some("alice"));
    let port = free_port();
    let (dave, registered) = self_registered(&home, "dave", port);
    let dave_id = registered["agent"]["agent_id"].as_str().unwrap().to_string();
    let sent = home.run_as(&alice, &["send", "dave", "are you there?", "--response", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let sent: Value = serde_json::from_slice(&sent.stdout).unwrap();
    let alice_task = sent["sender_task"]["id"].as_str().unwrap().to_string();
    // Dave has asked alice something too, and she took it.
    let dave_agent = agent_of(&registered);
    let asked = home.run_as(&dave_agent, &["send", "alice", "dave asks", "--response"]);
    assert!(asked.status.success(), "{}", describe(&asked));
    let ticket = home.inbox(&alice)[0]["ticket"].to_string();
    assert!(home.run_as(&alice, &["agent", "ack", &alice.id, &ticket]).status.success());
    crash(&home, dave, &dave_id);

    let waited = Instant::now();
    while !home.events().iter().any(|e| e["event"]["kind"] == "inbox_expired") {
        assert!(waited.elapsed() < DEADLINE, "the queue never expired");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, task) = home.http("GET", &format!("/tasks/{alice_task}"), None, &[]);
    assert_eq!(status, 200);
    assert_eq!(task["task"]["status"], "failed", "{task}");
    assert!(task.to_string().contains("was not started again"), "{task}");
    assert!(inbox_texts(&home, &dave_id).is_empty());
    // Alice learns it as she would get dave's reply: a reverse ticket saying why it failed.
    let told = inbox_texts(&home, &alice.id);
    assert!(
        told.len() == 1 && told[0].starts_with("Failed: ") && told[0].contains("was not started again"),
        "{told:?}"
    );
    let test_pid = std::process::id().to_string();
    let port_text = port.to_string();
    // Alice answers dave's question now: no one holds his id to read it (the answer was
    // queued under the free id, and the next agent on the port was given it).
    let late = home.run_as(&alice, &["reply", "too late", "--to", &dave_id]);
    assert!(late.status.success(), "{}", describe(&late));
    assert!(stderr(&late).contains("its queue has expired"), "{}", describe(&late));
    let reused = home.run(&["agent", "register", "--type", "dummy", "--pid", &test_pid, "--port", &port_text]);
    assert!(reused.status.success(), "the id is free again: {}", describe(&reused));
    assert!(inbox_texts(&home, &dave_id).is_empty(), "{:?}", inbox_texts(&home, &dave_id));
}

#[test]
fn re_registering_bobs_name_with_bobs_pid_from_another_process_is_refused_and_bob_keeps_working() {
    let home = Home::new();
    let announced = start(&home, "bob");
    let bob = as_agent(&announced);
    let _wrappers = Wrappers(&home, vec![bob.id.clone()]);
    let bob_pid = pid_of(&announced).to_string();

    // The attack of issue 12: bob's pid and name, from a process that is not bob.
    let hijack = home.run(&["agent", "register", "--type", "dummy", "--pid", &bob_pid, "--name", "bob"]);
    assert!(!hijack.status.success(), "{}", describe(&hijack));
    assert!(stderr(&hijack).contains("may not register process"), "{}", describe(&hijack));
    assert!(!stdout(&hijack).contains("secret"), "the caller gets no secret");

    // Over TCP, no process is proved at all.
    let body = json!({"agent_type": "dummy", "pid": pid_of(&announced), "name": "bob"}).to_string();
    let (status, refused) = http_tcp(broker_port(&home), "POST", "/agents", Some(body.as_bytes()), &[]);
    assert_eq!(status, 403, "{refused}");
    assert!(refused.get("secret").is_none());

    // With its own (provable) pid the name is still bob's while bob lives.
    let test_pid = std::process::id().to_string();
    let taken = home.run(&["agent", "register", "--type", "dummy", "--pid", &test_pid, "--name", "bob", "--port", "0"]);
    assert!(!taken.status.success(), "{}", describe(&taken));
    assert!(stderr(&taken).contains("is taken by agent"), "{}", describe(&taken));
    // And so is bob's id (its port).
    let port = bob.port.to_string();
    let slot = home.run(&["agent", "register", "--type", "dummy", "--pid", &test_pid, "--port", &port]);
    assert!(!slot.status.success(), "{}", describe(&slot));

    // Bob keeps working: same registration, its secret still accepted, messages reach it.
    let listed = agents(&home);
    let listed_bob = listed.iter().find(|agent| agent["name"] == "bob").expect("bob is listed");
    assert_eq!(listed_bob["agent_id"], bob.id.as_str());
    assert_eq!(listed_bob["pid"].as_u64().unwrap().to_string(), bob_pid);
    let own = home.run_as(&bob, &["agent", "status", &bob.id, "READY"]);
    assert!(own.status.success(), "bob's secret still works: {}", describe(&own));
    home.ok(&["send", "bob", "still yours", "--no-response"]);
    let registrations = home.events().iter().filter(|e| e["event"]["kind"] == "agent_registered").count();
    assert_eq!(registrations, 1, "nothing re-registered bob");
}

#[test]
fn registering_the_pid_of_an_unrelated_process_is_refused() {
    let home = Home::new();
    // A child of the test is neither the registering CLI, nor its ancestor, nor its child.
    let mut bystander = Bystander::sleep();
    let pid = bystander.pid().to_string();
    let refused = home.run(&["agent", "register", "--type", "dummy", "--pid", &pid, "--name", "victim", "--port", "0"]);
    assert!(!refused.status.success(), "{}", describe(&refused));
    assert!(stderr(&refused).contains("never an unrelated process"), "{}", describe(&refused));
    assert!(agents(&home).is_empty());
    assert!(bystander.is_running());

    // Registering one's caller (an ancestor: the test process) is how the helpers work.
    let agent = home.register(Some("helper"));
    assert!(agent.id.starts_with("synapse-dummy-"));
}

#[test]
fn synapse_stop_never_signals_a_process_synapse_did_not_start() {
    let home = Home::new();
    // A shell registers itself (a proved registration), then becomes a plain `sleep`.
    let registration = home.dir.path().join("victim.json");
    let script = format!(
        "'{BIN}' agent register --type dummy --pid $$ --name victim --port 0 > '{}' && exec sleep 120",
        registration.display()
    );
    home.events(); // starts the broker
    let mut victim = Bystander(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .env("SYNAPSE_HOME", home.home())
            .env("SYNAPSE_UDS_DIR", home.uds())
            .env("SYNAPSE_BROKER_PORT", "0")
            .env_remove("SYNAPSE_AGENT_ID")
            .env_remove("SYNAPSE_AGENT_SECRET")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while !agents(&home).iter().any(|agent| agent["name"] == "victim") {
        assert!(victim.is_running(), "the registering shell ended early");
        assert!(started.elapsed() < DEADLINE, "the victim never registered");
        std::thread::sleep(Duration::from_millis(20));
    }

    let stop = home.run(&["stop", "victim"]);
    assert!(!stop.status.success(), "{}", describe(&stop));
    assert!(stderr(&stop).contains("not a synapse wrapper"), "{}", describe(&stop));
    assert!(victim.is_running(), "synapse stop signalled a process it did not start");

    // A wrapper Synapse started is still stopped.
    let bob = start(&home, "bob");
    let stopped = home.run(&["stop", "bob"]);
    assert!(stopped.status.success(), "{}", describe(&stopped));
    wait_until_dead(pid_of(&bob));
}

#[test]
fn agents_cancel_lock_and_read_inboxes_only_as_themselves_and_the_user_for_anyone() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let carol = home.register(Some("carol"));

    // Inbox: bob's own and the user's reads pass; carol's and an anonymous TCP caller's do not.
    let sent = home.run_as(&alice, &["send", "bob", "for bob only", "--response", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let sent: Value = serde_json::from_slice(&sent.stdout).unwrap();
    let task_id = sent["task"]["id"].as_str().unwrap().to_string();
    let snoop = home.run_as(&carol, &["agent", "inbox", &bob.id]);
    assert!(!snoop.status.success(), "{}", describe(&snoop));
    assert!(!stdout(&snoop).contains("for bob only"));
    let (status, _) = http_tcp(broker_port(&home), "GET", &format!("/agents/{}/inbox", bob.id), None, &[]);
    assert_eq!(status, 403);
    assert!(home.run_as(&bob, &["agent", "inbox", &bob.id]).status.success());
    assert_eq!(home.inbox(&bob).len(), 1, "the user reads any inbox");

    // Cancel: not carol, not an anonymous TCP caller (the sender is an agent); the user may.
    let cancel = format!("/agents/{}/tasks/{task_id}/cancel", bob.id);
    let (status, body) = home.http("POST", &cancel, None, &[("x-synapse-agent-secret", &carol.secret)]);
    assert_eq!(status, 403, "{body}");
    let (status, body) = http_tcp(bob.port, "POST", &format!("/tasks/{task_id}/cancel"), None, &[]);
    assert_eq!(status, 403, "{body}");
    let (status, body) = home.http("POST", &cancel, None, &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["task"]["status"], "canceled");
    // The receiver may cancel a task it received.
    let sent: Value =
        serde_json::from_slice(&home.run_as(&alice, &["send", "bob", "again", "--response", "--json"]).stdout).unwrap();
    let again = sent["task"]["id"].as_str().unwrap();
    let (status, body) = home.http(
        "POST",
        &format!("/agents/{}/tasks/{again}/cancel", bob.id),
        None,
        &[("x-synapse-agent-secret", &bob.secret)],
    );
    assert_eq!(status, 200, "{body}");

    // File safety: carol can't lock, record or unlock as alice, nor force alice's live lock.
    let file = home.dir.path().join("shared.rs");
    let file = file.to_str().unwrap();
    let fs_as = |agent: &Agent, args: &[&str]| {
        home.cmd(&[&["file-safety"], args].concat())
            .env("SYNAPSE_FILE_SAFETY_ENABLED", "true")
            .env("SYNAPSE_AGENT_ID", &agent.id)
            .env("SYNAPSE_AGENT_SECRET", &agent.secret)
            .output()
            .unwrap()
    };
    let fs_user = |args: &[&str]| {
        home.cmd(&[&["file-safety"], args].concat()).env("SYNAPSE_FILE_SAFETY_ENABLED", "true").output().unwrap()
    };
    let forged = fs_as(&carol, &["lock", file, &alice.id]);
    assert!(!forged.status.success(), "{}", describe(&forged));
    assert!(stderr(&forged).contains("acts only as itself"), "{}", describe(&forged));
    let locked = fs_as(&alice, &["lock", file, &alice.id]);
    assert!(locked.status.success(), "{}", describe(&locked));
    assert!(!fs_as(&carol, &["unlock", file, &alice.id]).status.success());
    let forced = fs_as(&carol, &["unlock", file, &carol.id, "--force"]);
    assert!(!forced.status.success(), "{}", describe(&forced));
    assert!(stderr(&forced).contains("only the user may force-release"), "{}", describe(&forced));
    assert!(!fs_as(&carol, &["record", file, &alice.id, &task_id]).status.success());
    let (status, _) = http_tcp(
        broker_port(&home),
        "POST",
        "/file-safety/unlock",
        Some(json!({"path": file, "agent_id": alice.id, "force": true}).to_string().as_bytes()),
        &[],
    );
    assert_eq!(status, 403, "an anonymous TCP caller unlocks nothing");
    // The user may force-unlock anyone's lock, and lock for any agent.
    let user_forced = fs_user(&["unlock", file, "--force"]);
    assert!(user_forced.status.success(), "{}", describe(&user_forced));
    assert!(fs_user(&["lock", file, &bob.id]).status.success());
    assert!(fs_user(&["unlock", file, &bob.id]).status.success());
}

#[test]
fn broker_control_routes_are_refused_to_tcp_callers_without_the_key_and_to_agents_but_open_to_the_user() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let port = broker_port(&home);
    let cleanup = br#"{"days":1,"dry_run":true}"#;
    let routes: Vec<(&str, &str, Option<&[u8]>)> = vec![
        ("GET", "/admin/index", None),
        ("POST", "/admin/verify", None),
        ("POST", "/history/cleanup", Some(cleanup)),
        ("GET", "/webhooks", None),
        ("POST", "/webhooks", Some(br#"{"url":"http://example.com/hook"}"#)),
        ("GET", "/webhooks/deliveries", None),
        ("GET", "/external", None),
        ("POST", "/external", Some(br#"{"url":"http://example.com"}"#)),
        ("POST", "/file-safety/cleanup", Some(br#"{"days":1}"#)),
        ("POST", "/broker/shutdown", None),
    ];
    for (method, path, body) in &routes {
        let (status, answer) = http_tcp(port, method, path, *body, &[]);
        assert_eq!(status, 403, "{method} {path} over TCP: {answer}");
        assert!(answer["message"].as_str().unwrap().contains("for the user only"), "{answer}");
        let (status, answer) = home.http(method, path, *body, &[("x-synapse-agent-secret", &bob.secret)]);
        assert_eq!(status, 403, "{method} {path} as an agent: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(&bob.id), "{answer}");
    }
    // From inside an agent the CLI (which sends the agent's secret) cannot stop the broker.
    let refused = home.run_as(&bob, &["broker", "stop"]);
    assert!(!refused.status.success(), "{}", describe(&refused));
    assert!(stderr(&refused).contains("for the user only"), "{}", describe(&refused));
    let pid = home.broker_pid().expect("the broker still runs");
    assert!(is_alive(pid));
    // The user, from a plain shell over the socket: the read-only ones answer, then stop works.
    for (method, path, body) in &routes[..4] {
        let (status, answer) = home.http(method, path, *body, &[]);
        assert_eq!(status, 200, "{method} {path} as the user: {answer}");
    }
    assert_eq!(home.http("GET", "/external", None, &[]).0, 200);
    home.ok(&["broker", "stop"]);
    wait_until_dead(pid);
}

/// The python3 helpers' connection to the broker's Unix socket (`sock_path`): a class put
/// after the helper's first three lines (its imports and arguments).
const UNIX_CLASS: &str = r#"class Unix(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost")
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sock_path)
"#;

/// `helper` with [`UNIX_CLASS`] after its imports and arguments.
fn with_unix_class(helper: &str) -> String {
    let mut lines: Vec<&str> = helper.lines().collect();
    lines.insert(3.min(lines.len()), UNIX_CLASS.trim_end());
    lines.join("\n")
}

/// A helper in python3: `peer-gone` connects to the broker's socket, forks, and the connecting
/// parent exits before the child sends on the inherited connection; `reparented` registers
/// itself as an agent's wrapper, and a process two levels below it connects, lets its parent
/// exit (so it is reparented to init) and then sends. Both send a cancel without a secret
/// and print the answer's status.
const CANCEL_HELPER: &str = r#"
import http.client, json, os, socket, sys, time
mode, sock_path, path = sys.argv[1], sys.argv[2], sys.argv[3]
def call(conn, method, target, body=b""):
    conn.request(method, target, body=body, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    return answer.status, answer.read()
def wait_orphaned(parent):
    deadline = time.time() + 20
    while os.getppid() == parent and time.time() < deadline:
        time.sleep(0.01)
if mode == "peer-gone":
    conn = Unix(); conn.connect()
    parent = os.getpid()
    if os.fork() == 0:
        wait_orphaned(parent)
        print(call(conn, "POST", path)[0], flush=True)
        os._exit(0)
    os._exit(0)
else:
    me = Unix()
    body = json.dumps({"agent_type": "dummy", "name": "wrapped", "pid": os.getpid(), "port": 0}).encode()
    status, answer = call(me, "POST", "/agents", body)
    assert status == 200, answer
    reader, writer = os.pipe()
    if os.fork() == 0:
        middle = os.getpid()
        if os.fork() == 0:
            conn = Unix(); conn.connect()
            call(conn, "GET", "/broker/health")
            os.write(writer, b"x")
            wait_orphaned(middle)
            print(call(conn, "POST", path)[0], flush=True)
            os._exit(0)
        os.read(reader, 1)
        os._exit(0)
    time.sleep(120)
"#;

fn cancel_from_helper(home: &Home, mode: &str, path: &str) -> (String, std::process::Child) {
    let mut helper = std::process::Command::new("python3")
        .args(["-c", &with_unix_class(CANCEL_HELPER), mode, home.socket().to_str().unwrap(), path])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(helper.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    (line.trim().to_string(), helper)
}

#[test]
fn a_connection_whose_peer_exited_or_whose_parent_left_an_agent_is_not_the_user() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let sent = home.run_as(&alice, &["send", "bob", "alice's task", "--response", "--json"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let sent: Value = serde_json::from_slice(&sent.stdout).unwrap();
    let cancel = format!("/agents/{}/tasks/{}/cancel", bob.id, sent["task"]["id"].as_str().unwrap());

    // The process that connected is gone: its child, sending on the connection, is anonymous.
    let (status, mut helper) = cancel_from_helper(&home, "peer-gone", &cancel);
    let _ = helper.wait();
    assert_eq!(status, "403", "a child of a vanished peer cancelled another agent's task");

    // Below a wrapper, then reparented to init before sending: still not the user.
    let (status, mut wrapper) = cancel_from_helper(&home, "reparented", &cancel);
    let _ = wrapper.kill();
    let _ = wrapper.wait();
    assert_eq!(status, "403", "a process that left its agent's wrapper cancelled another agent's task");

    // A plain process of the user's is the user.
    let (status, body) = home.http("POST", &cancel, None, &[]);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn the_users_anonymous_send_is_cancelled_only_by_the_user_while_a_tcp_callers_stays_open_to_anyone() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let sent: Value =
        serde_json::from_str(&home.ok(&["send", "bob", "from the user", "--response", "--json"])).unwrap();
    let users = sent["task"]["id"].as_str().unwrap().to_string();
    let (status, body) = http_tcp(bob.port, "POST", &format!("/tasks/{users}/cancel"), None, &[]);
    assert_eq!(status, 403, "an anonymous TCP caller cancelled the user's send: {body}");

    // Sent anonymously over TCP (A2A): anyone anonymous may cancel it, as before.
    let message = br#"{"message":{"role":"user","parts":[{"type":"text","text":"from somebody"}]}}"#;
    let (status, sent) = http_tcp(bob.port, "POST", "/tasks/send", Some(message), &[]);
    assert_eq!(status, 200, "{sent}");
    let theirs = sent["task"]["id"].as_str().unwrap();
    let (status, body) = http_tcp(bob.port, "POST", &format!("/tasks/{theirs}/cancel"), None, &[]);
    assert_eq!(status, 200, "{body}");

    // The user cancels the user's own send.
    let (status, body) = home.http("POST", &format!("/agents/{}/tasks/{users}/cancel", bob.id), None, &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["task"]["status"], "canceled");
}

/// Issue 15 (mixed teams): a sender that names itself without its secret, as a Python Synapse
/// agent does (`metadata.sender`), is an unverified external sender: its message is delivered,
/// shown as unverified, its endpoint recorded; it can never pass for a registered agent, and a
/// name that could act on a terminal or the header is refused.
#[test]
fn an_unverified_external_sender_is_delivered_as_such_and_cannot_pass_for_a_registered_agent() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let alice = home.register(Some("alice"));
    let send = |sender: Value| {
        let body = json!({
            "message": {"role": "user", "parts": [{"type": "text", "text": "hello from python"}]},
            "metadata": {"sender": sender, "response_mode": "notify"},
        });
        http_tcp(bob.port, "POST", "/tasks/send", Some(body.to_string().as_bytes()), &[])
    };
    let (status, sent) = send(json!({"sender_id": "py-agent-1", "sender_endpoint": "http://127.0.0.1:8199"}));
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["task"]["metadata"]["response_expected"], true, "{sent}");
    let (_, inbox) = home.http("GET", &format!("/agents/{}/inbox", bob.id), None, &[]);
    let prefix = inbox["tickets"][0]["prefix"].as_str().unwrap_or_default().to_string();
    assert!(prefix.ends_with(":py-agent-1(unverified):R]"), "{inbox}");
    let events = home.ok(&["events", "--json"]);
    assert!(events.contains(r#""unverified_sender":"py-agent-1""#), "{events}");
    assert!(events.contains(r#""sender_endpoint":"http://127.0.0.1:8199""#), "{events}");

    // A registered agent's id or name, without its secret (or with a wrong one): refused.
    for claimed in [alice.id.as_str(), "alice", "bob"] {
        let (status, answer) = send(json!({"sender_id": claimed}));
        assert_eq!(status, 403, "{claimed} passed for a registered agent: {answer}");
    }
    let body = json!({"message": {"role": "user", "parts": [{"type": "text", "text": "x"}]},
                      "metadata": {"sender": {"sender_id": alice.id}}});
    let (status, _) = http_tcp(
        bob.port,
        "POST",
        "/tasks/send",
        Some(body.to_string().as_bytes()),
        &[("X-Synapse-Agent-Secret", "forged")],
    );
    assert_eq!(status, 403);
    // Names that would break the header or act on a terminal.
    for claimed in ["py:agent", "evil\u{1b}[31m", "a b", &"x".repeat(65)] {
        let (status, answer) = send(json!({"sender_id": claimed}));
        assert_eq!(status, 400, "{claimed:?}: {answer}");
    }
    let (status, answer) = send(json!({"sender_id": "py-agent-2", "sender_endpoint": "http://h/\u{7}"}));
    assert_eq!(status, 400, "{answer}");
    // Nothing refused reached bob.
    let (_, inbox) = home.http("GET", &format!("/agents/{}/inbox", bob.id), None, &[]);
    assert_eq!(inbox["tickets"].as_array().map(Vec::len), Some(1), "{inbox}");
}

/// Issue 15 (mixed teams): the reply to an unverified external sender that gave its endpoint
/// and its own task (a Python Synapse agent) goes back to that endpoint as its own A2A send
/// does it, from the replying agent and naming the sender's task (`in_reply_to`), once.
#[test]
fn a_reply_to_an_unverified_external_sender_goes_back_to_its_endpoint() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let (port, received) = receiver(std::sync::Arc::new(std::sync::atomic::AtomicU16::new(200)));
    let body = json!({
        "message": {"role": "user", "parts": [{"type": "text", "text": "what is 6 x 7?"}]},
        "metadata": {
            "sender": {"sender_id": "py-agent-1", "sender_endpoint": format!("http://127.0.0.1:{port}")},
            "sender_task_id": "py-task-1",
            "response_mode": "wait",
        },
    });
    let (status, sent) = http_tcp(bob.port, "POST", "/tasks/send", Some(body.to_string().as_bytes()), &[]);
    assert_eq!(status, 200, "{sent}");
    let reply = json!({"from": bob.id, "secret": bob.secret, "text": "42"});
    let (status, replied) = home.http("POST", "/reply", Some(reply.to_string().as_bytes()), &[]);
    assert_eq!(status, 200, "{replied}");
    let request = received.recv_timeout(DEADLINE).expect("the reply posted to the sender's endpoint");
    let delivered = request.json();
    assert_eq!(delivered["message"]["parts"][0]["text"], "42", "{delivered}");
    assert_eq!(delivered["metadata"]["in_reply_to"], "py-task-1", "{delivered}");
    assert_eq!(delivered["metadata"]["sender"]["sender_id"], bob.id.as_str(), "{delivered}");
    assert!(request.body.len() < 4096 && !request.body.contains(&bob.secret), "no secret travels with it");
    // The sender's task id is what another Synapse broker's reply endpoint takes as its token:
    // the log keeps it, the event stream shows it redacted (anyone may read /events).
    let events = home.ok(&["events", "--json"]);
    assert!(!events.contains("py-task-1") && events.contains("\"external_task_id\":\"[redacted]\""), "{events}");
    let (status, streamed) = http_tcp(broker_port(&home), "GET", "/events?after=0", None, &[]);
    assert_eq!(status, 200);
    assert!(!streamed.to_string().contains("py-task-1"), "{streamed}");
}

/// A helper in python3: with `wrapped`, it registers itself as an agent's wrapper over the
/// broker's socket and a child of it asks; with `plain`, it asks itself. The question is a GET
/// of the path given, over loopback TCP, claiming the broker's own Origin (as the dashboard
/// page does); it prints the answer's status.
const ORIGIN_HELPER: &str = r#"
import http.client, json, os, socket, sys
mode, sock_path, port, path, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
def ask():
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Origin": f"http://127.0.0.1:{port}"}
    if key:
        headers["X-Synapse-Page-Key"] = key
    conn.request("GET", path, headers=headers)
    return conn.getresponse().status
if mode == "wrapped":
    me = Unix()
    body = json.dumps({"agent_type": "dummy", "name": "wrapped", "pid": os.getpid(), "port": 0}).encode()
    me.request("POST", "/agents", body=body, headers={"Content-Type": "application/json"})
    answer = me.getresponse()
    assert answer.status == 200, answer.read()
    reader, writer = os.pipe()
    if os.fork() == 0:
        os.write(writer, str(ask()).encode())
        os._exit(0)
    print(os.read(reader, 16).decode(), flush=True)
    os.wait()
else:
    print(ask(), flush=True)
"#;

/// Issue 17: the dashboard in the user's browser acts as the user (loopback TCP, the broker's
/// uid, the broker's own Origin, the page key), but a process inside an agent that writes the
/// same Origin and key is not the user: the process holding its socket is found and its
/// ancestry checked, as on the Unix socket. Without the key, the Origin makes no one the user.
#[test]
fn the_brokers_origin_makes_the_users_browser_the_user_but_not_a_process_inside_an_agent() {
    let home = Home::new();
    let someone = home.register(Some("someone"));
    let port = broker_port(&home).to_string();
    let socket = home.socket();
    // Another agent's inbox: the user's to read, not an anonymous caller's.
    let inbox = format!("/agents/{}/inbox", someone.id);
    let (status, key) = home.http("GET", "/dashboard/page-key", None, &[]);
    assert_eq!(status, 200, "{key}");
    let key = key["key"].as_str().unwrap().to_string();
    let ask_with = |mode: &str, path: &str, key: &str| {
        let output = std::process::Command::new("python3")
            .args(["-c", &with_unix_class(ORIGIN_HELPER), mode, socket.to_str().unwrap(), &port, path, key])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        stdout(&output).trim().to_string()
    };
    let ask_for = |mode: &str, path: &str| ask_with(mode, path, &key);
    let ask = |mode: &str| ask_for(mode, &inbox);
    assert_eq!(ask("plain"), "200", "a process of the user outside any agent, with the broker's Origin and key");
    assert_eq!(ask_with("plain", &inbox, ""), "403", "the Origin without the page key");
    assert_eq!(ask("wrapped"), "403", "a process below an agent's wrapper claimed the user's rights");
    // Without the Origin (or with another one) the same plain process is anonymous over TCP.
    let (status, _) = http_tcp(broker_port(&home), "GET", &inbox, None, &[]);
    assert_eq!(status, 403);
    // The page is the user for sending, reading and canceling only: the broker's control
    // routes (external agents, webhooks, stop, admin) are not for a web page.
    assert_eq!(ask_for("plain", "/external"), "403", "a page at the broker's origin controlled the broker");
    assert_eq!(ask_for("plain", "/webhooks"), "403");
}

fn leave(home: &Home, agent: &Agent) {
    let (status, answer) =
        home.http("DELETE", &format!("/agents/{}", agent.id), None, &[("X-Synapse-Agent-Secret", &agent.secret)]);
    assert_eq!(status, 200, "{answer}");
}

/// An agent that asked and left without anything queued frees its id; a new agent started on
/// its port gets that id. The reply to the old agent's question is not typed into the new one
/// (it was: the new session got an answer to a question it never asked); it is kept with the
/// task and the replier is told. The same agent started again with its name and type gets it.
#[test]
fn a_reply_to_an_agent_that_left_reaches_it_again_under_its_name_and_never_a_new_agent_on_its_port() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let anonymous = home.register_on(free_port(), None);
    let carol = home.register_on(free_port(), Some("carol"));
    for (asker, question) in [(&anonymous, "question one"), (&carol, "question two")] {
        let sent = home.run_as(asker, &["send", "bob", question, "--response"]);
        assert!(sent.status.success(), "{}", describe(&sent));
    }
    let tickets: Vec<Value> = home.inbox(&bob);
    for ticket in &tickets {
        let ack = home.run_as(&bob, &["agent", "ack", &bob.id, &ticket["ticket"].to_string()]);
        assert!(ack.status.success(), "{}", describe(&ack));
    }
    leave(&home, &anonymous);
    leave(&home, &carol);
    // Another process, unnamed, on the first asker's port.
    let (_newcomer_process, registered) = self_registered(&home, "", anonymous.port);
    let newcomer = agent_of(&registered);
    assert_eq!(newcomer.id, anonymous.id, "nothing held the id");
    let carol_again = home.register_on(carol.port, Some("carol"));
    assert_eq!(carol_again.id, carol.id);

    let to_newcomer = home.run_as(&bob, &["reply", "answer one", "--to", &anonymous.id]);
    assert!(to_newcomer.status.success(), "{}", describe(&to_newcomer));
    assert!(stderr(&to_newcomer).contains("now names another agent"), "{}", describe(&to_newcomer));
    let to_carol = home.run_as(&bob, &["reply", "answer two", "--to", "carol"]);
    assert!(to_carol.status.success(), "{}", describe(&to_carol));
    assert!(home.inbox(&newcomer).is_empty(), "{:?}", home.inbox(&newcomer));
    let carols: Vec<String> =
        home.inbox(&carol_again).iter().map(|t| t["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(carols, ["answer two"]);
    // The answer is kept with the first asker's task, and no ticket was issued for it.
    let events = home.events();
    let kind = |event: &Value| event["event"]["kind"].as_str().unwrap_or_default().to_string();
    assert!(events.iter().any(|e| kind(e) == "reply_posted" && e["event"]["data"]["text"] == "answer one"));
    assert!(
        !events
            .iter()
            .any(|e| kind(e) == "reverse_ticket_issued" && e["event"]["data"]["agent_id"] == anonymous.id.as_str()),
        "a reverse ticket for the new agent"
    );
}

/// A registration's name, role and working directory are bounded, and a name is one visible
/// word: each bad one gets a 400 that says what is wrong, and nothing is registered.
#[test]
fn bad_registration_fields_are_refused_with_a_reason() {
    let home = Home::new();
    home.events(); // starts the broker
    let pid = std::process::id();
    let long_dir = format!("/{}", "d".repeat(5000));
    let cases = [
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "name": "a\u{1b}[2Jb"}), "Invalid name 'a^[[2Jb'"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "name": "two words"}), "no spaces"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "name": "x".repeat(65)}), "1 to 64 bytes"),
        // 17 characters, 68 bytes: the bound is in bytes, and the message says so.
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "name": "\u{1f600}".repeat(17)}), "1 to 64 bytes"),
        // A right-to-left override reorders the rest of a `synapse list` line; a zero-width
        // space makes a name look like another's.
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "name": "bob\u{202e}live"}), "invisible formatting"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "name": "bob\u{200b}"}), "invisible formatting"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "role": "r".repeat(1001)}), "at most 1000"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "role": "a\u{1b}[31mb"}), "Invalid role 'a^[[31mb'"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "role": "line\none"}), "no control"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "role": "x\u{202e}y"}), "invisible formatting"),
        (json!({"agent_type": "dummy", "pid": pid, "port": 0, "working_dir": long_dir}), "at most 4096"),
    ];
    for (body, expected) in cases {
        let (status, answer) = home.http("POST", "/agents", Some(body.to_string().as_bytes()), &[]);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer["message"].as_str().unwrap_or_default().contains(expected), "{body}: {answer}");
    }
    assert!(agents(&home).is_empty(), "nothing registered");
    let fine = json!({"agent_type": "dummy", "pid": pid, "port": 0, "role": "r".repeat(1000)});
    let (status, answer) = home.http("POST", "/agents", Some(fine.to_string().as_bytes()), &[]);
    assert_eq!(status, 200, "{answer}");
}

/// The same process registering again without a name (its wrapper restored after a failed
/// start, say) is the same agent: the reply to its question reaches it. (A reply to an agent
/// whose queue expired reaches no one: see the expiry test above.)
#[test]
fn a_reply_reaches_the_same_process_registered_again_without_a_name() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let asker = home.register_on(free_port(), None);
    assert!(home.run_as(&asker, &["send", "bob", "question", "--response"]).status.success());
    let ticket = home.inbox(&bob)[0]["ticket"].to_string();
    assert!(home.run_as(&bob, &["agent", "ack", &bob.id, &ticket]).status.success());
    leave(&home, &asker);
    let again = home.register_on(asker.port, None);
    assert_eq!(again.id, asker.id);
    let replied = home.run_as(&bob, &["reply", "answer", "--to", &asker.id]);
    assert!(replied.status.success() && !stderr(&replied).contains("Warning"), "{}", describe(&replied));
    let texts: Vec<String> = home.inbox(&again).iter().map(|t| t["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(texts, ["answer"]);
}
