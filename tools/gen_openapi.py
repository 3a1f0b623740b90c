"""Writes schema/openapi.json. The document is data: edit this generator, run
`python3 tools/gen_openapi.py` (or give it another file to write), and the unit test in
src/http/openapi.rs checks that every route in src/http is described and nothing else is;
tests/api_contract.rs checks that schema/openapi.json is what this writes."""
import json
import os
E={"$ref":"#/components/schemas/Error"}
def resp(desc="OK", schema=None, extra=None):
    r={"200":{"description":desc,"content":{"application/json":{"schema":schema or {"type":"object"}}}}}
    for code,d in (extra or {}).items():
        r[str(code)]={"description":d,"content":{"application/json":{"schema":E}}}
    return r
def body(ref):
    return {"required":True,"content":{"application/json":{"schema":{"$ref":f"#/components/schemas/{ref}"}}}}
def pp(*names):
    return [{"name":n,"in":"path","required":True,"schema":{"type":"string"}} for n in names]
def q(name,typ="string",desc=""):
    return {"name":name,"in":"query","required":False,"schema":{"type":typ},"description":desc}
bad={400:"Bad input",404:"Unknown agent or task"}
P={}
def add(path,method,summary,**kw):
    op={"summary":summary,"responses":kw.pop("responses",resp(extra=bad))}
    if "params" in kw: op["parameters"]=kw.pop("params")
    if "body" in kw: op["requestBody"]=body(kw.pop("body"))
    if "tags" in kw: op["tags"]=kw.pop("tags")
    P.setdefault(path,{})[method]=op
A2A="Per-agent endpoints: served at the root of the agent's port and Unix socket, and by the broker under /agents/{agent}."
# broker
add("/broker/health","get","Broker pid, version, schema, socket, port and head (version handshake)",tags=["broker"],responses=resp(schema={"$ref":"#/components/schemas/BrokerInfo"}))
add("/broker/shutdown","post","Stop the broker cleanly",tags=["broker"],responses=resp())
add("/events","get","The event log as server-sent events (id = sequence number; Last-Event-ID resumes)",tags=["broker"],params=[q("after","integer","start after this sequence number"),q("follow","boolean","keep streaming new events"),q("agent","string","only events about this agent"),q("kind","string","comma-separated event kinds"),q("token","string","a stream token from POST /dashboard/stream-token, instead of a key (for a browser's EventSource)")],responses={"200":{"description":"SSE stream; each data is an Envelope as JSON","content":{"text/event-stream":{"schema":{"type":"string"}}}},"400":{"description":"Bad query","content":{"application/json":{"schema":E}}}})
add("/admin/rebuild","post","Drop and replay every projection",tags=["admin"],responses=resp(schema={"$ref":"#/components/schemas/RebuildReport"}))
add("/admin/verify","post","Replay into scratch tables and compare with the live projections",tags=["admin"],responses=resp(schema={"$ref":"#/components/schemas/VerifyReport"}))
add("/admin/index","get","Where the history search index stands",tags=["admin"],responses=resp(schema={"$ref":"#/components/schemas/IndexProgress"}))
add("/admin/index","post","Bring the history search index up to the newest event",tags=["admin"],responses=resp(schema={"$ref":"#/components/schemas/IndexProgress"}))
add("/agents","get","Live agents with status and queue depth",tags=["agents"],responses=resp())
add("/agents","post","Register an agent (the broker allocates the port and returns the id and a secret)",tags=["agents"],body="RegisterBody",responses=resp(schema={"$ref":"#/components/schemas/Registration"},extra={400:"Bad input",409:"Port or name taken"}))
add("/agents/{agent}","delete","Deregister the agent (X-Synapse-Agent-Secret)",tags=["agents"],params=pp("agent"),responses=resp(extra={403:"Secret missing or wrong",404:"Unknown agent"}))
add("/agents/{agent}","post","A2A JSON-RPC 2.0 binding of this agent (same as POST / on its port)",tags=["a2a"],params=pp("agent"),body="JsonRpcRequest",responses=resp(schema={"$ref":"#/components/schemas/JsonRpcResponse"}))
add("/agents/{agent}/","post","A2A JSON-RPC 2.0 binding of this agent",tags=["a2a"],params=pp("agent"),body="JsonRpcRequest",responses=resp(schema={"$ref":"#/components/schemas/JsonRpcResponse"}))
add("/agents/{agent}/inbox","get","Tickets still to be written into the agent's PTY, in delivery order (long-poll with wait_ms)",tags=["agents"],params=pp("agent")+[q("wait_ms","integer"),q("limit","integer")])
add("/agents/{agent}/inbox/{ticket}/ack","post","Record that a ticket was written into the PTY (X-Synapse-Agent-Secret). With next=true the answer is {ticket, inbox}: the inbox (its first `limit` tickets) as it stands once the acknowledgement is stored",tags=["agents"],params=pp("agent","ticket")+[q("next","boolean","also answer with the inbox after the acknowledgement"),q("limit","integer","with next: 1..10000, default 100"),{"name":"how","in":"query","required":False,"schema":{"type":"string","enum":["typed","handed_over","unwritten"]},"description":"how the ticket reached the CLI: typed at its prompt, handed over mid-turn by its hook, or not written into this CLI (recorded in ticket_injected; decides whether a message canceled on its way interrupts the CLI)"}],responses=resp(extra={400:"Bad ticket or query",403:"Secret",404:"Not in the inbox (acknowledged already, or never queued). A message canceled on its way to the CLI (taken by the wrapper before the cancel, within ten minutes) is answered 200 once, its cancel notice queued"}))
add("/agents/{agent}/tasks/{id}/update","post","The receiving agent moves its task (state, artifacts); the sender's task follows (X-Synapse-Agent-Secret)",tags=["agents"],params=pp("agent","id"),body="UpdateTaskRequest",responses=resp(extra={400:"Bad input",403:"Secret",404:"Unknown task"}))
add("/agents/{agent}/status","get","The agent's status (open)",tags=["agents"],params=pp("agent"))
add("/agents/{agent}/status","post","Report READY / PROCESSING / WAITING (X-Synapse-Agent-Secret)",tags=["agents"],params=pp("agent"),body="StatusBody",responses=resp(extra={400:"Bad status",403:"Secret",404:"Unknown agent"}))
add("/send","post","Send a message (what synapse send uses): target by name, id, type-port or type",tags=["messaging"],body="SendRequest",responses=resp(schema={"$ref":"#/components/schemas/SendOutcome"},extra={400:"Bad input, ambiguous target or id",403:"Identity not proven",404:"Unknown agent",409:"Already answered",413:"Too large"}))
add("/reply","post","Answer the agent's most recent reply target (or the one of 'to')",tags=["messaging"],body="ReplyBody",responses=resp(schema={"$ref":"#/components/schemas/SendOutcome"},extra={400:"Several targets",403:"Identity",404:"No reply target",409:"Already answered"}))
add("/tasks/{id}","get","One task by full id or unique prefix (broker-wide; on an agent port: that agent's tasks)",tags=["messaging"],params=pp("id"),responses=resp(schema={"type":"object","properties":{"task":{"$ref":"#/components/schemas/Task"}}},extra=bad))
add("/tasks/{id}/wait","get","Answer when the task reaches a final state (following the log) or the timeout passes",tags=["messaging"],params=pp("id")+[q("timeout_ms","integer")])
add("/external","get","External agents",tags=["external"])
add("/external","post","Add an external agent (reads agent-card.json, then agent.json)",tags=["external"],body="ExternalAddBody",responses=resp(extra={400:"Bad URL or alias",409:"Alias taken",502:"Unreachable or malformed card",504:"Timed out"}))
add("/external/{alias}","get","One external agent",tags=["external"],params=pp("alias"))
add("/external/{alias}","delete","Forget an external agent",tags=["external"],params=pp("alias"))
add("/external/{alias}/send","post","Send to an external agent; wait_seconds follows the remote task",tags=["external"],params=pp("alias"),body="ExternalSendBody",responses=resp(extra={400:"Bad input",404:"Unknown alias",502:"Remote failed",504:"Timed out"}))
REPLY_BODY={"required":True,"content":{"application/json":{"schema":{"type":"object"}}}}
REPLY_RESPONSES=resp("OK: the user's task, completed",extra={400:"Bad input (no in_reply_to, no text parts)",404:"No message waits for a reply with this token (unknown, or already answered)",409:"The task is already over"})
add("/external-replies/tasks/send","post","An external agent's reply to the user's message, naming its reply token as metadata.in_reply_to (the message's sender_task_id); open without a key: the token is the proof, and it completes the user's task once",tags=["external"],responses=REPLY_RESPONSES)
P["/external-replies/tasks/send"]["post"]["requestBody"]=REPLY_BODY
add("/external-replies/tasks/send-priority","post","The same as /external-replies/tasks/send (a Python Synapse agent replies here, with ?priority=3)",tags=["external"],params=[{"name":"priority","in":"query","required":False,"schema":{"type":"integer"}}],responses=REPLY_RESPONSES)
P["/external-replies/tasks/send-priority"]["post"]["requestBody"]=REPLY_BODY
add("/webhooks","get","Registered webhooks (secrets never shown)",tags=["webhooks"])
add("/webhooks","post","Register a webhook",tags=["webhooks"],body="WebhookBody",responses=resp(extra={400:"Bad URL or event"}))
add("/webhooks","delete","Remove a webhook",tags=["webhooks"],params=[q("url","string","the registered URL")],responses=resp(extra={400:"No url",404:"Not registered"}))
add("/webhooks/deliveries","get","Pending and recent webhook deliveries",tags=["webhooks"])
add("/openapi.json","get","This document",tags=["broker"])
add("/history","get","History records, newest first (one per task and side)",tags=["history"],params=[q("agent"),q("limit","integer")],responses=resp(extra={400:"Bad limit"}))
add("/history/{id}","get","The records of one task (full id or prefix)",tags=["history"],params=pp("id"),responses=resp(extra={400:"Ambiguous or malformed id",404:"Not in the history"}))
add("/threads/{id}","get","The conversation a task belongs to (its context: message, sender task, reply), oldest first",tags=["history"],params=pp("id"),responses=resp(extra={400:"Malformed id",404:"Unknown or ambiguous"}))
add("/history/search","get","Records holding the keywords as typed, each from the start of a word (keyword=, repeated, or q=comma-separated; logic OR|AND; case_sensitive)",tags=["history"],params=[{"name":"keyword","in":"query","required":False,"schema":{"type":"array","items":{"type":"string"}},"style":"form","explode":True,"description":"one keyword, whole (commas and spaces included); repeat it for more"},q("q","string","keywords, comma-separated (a keyword cannot hold a comma this way)"),q("logic"),q("case_sensitive","boolean"),q("agent"),q("limit","integer")],responses=resp(extra={400:"No keyword, a keyword without a letter or digit, more than 32 different keywords or one over 256 bytes, bad logic or limit"}))
add("/history/stats","get","Totals by state, success rate, per agent, date range, size",tags=["history"],params=[q("agent")])
add("/history/cleanup","post","Prune records last updated before days ago (or beyond max_size_mb); dry_run counts only",tags=["history"],body="HistoryCleanupBody",responses=resp(extra={400:"Bad days or size",403:"For the user only"}))
add("/file-safety/status","get","Lock and modification counts",tags=["file-safety"])
add("/file-safety/locks","get","Current locks (with expired flag)",tags=["file-safety"],params=[q("agent")])
add("/file-safety/lock","post","Lock a file for an agent (renews for the holder); wait_seconds waits for the release",tags=["file-safety"],body="LockBody",responses=resp(extra={400:"Bad path or duration",404:"Unknown agent",409:"File is already locked by <holder>"}))
add("/file-safety/unlock","post","Release a lock (holder, or force)",tags=["file-safety"],body="UnlockBody",responses=resp(extra={400:"Bad path",403:"Not the holder",404:"Not locked"}))
add("/file-safety/history","get","A file's modifications, newest first",tags=["file-safety"],params=[q("path"),q("limit","integer")],responses=resp(extra={400:"Bad path or limit"}))
add("/file-safety/recent","get","Recent modifications of every file",tags=["file-safety"],params=[q("agent"),q("limit","integer")],responses=resp(extra={400:"Bad limit"}))
add("/file-safety/record","post","Record a modification (CREATE, MODIFY, DELETE)",tags=["file-safety"],body="RecordBody",responses=resp(extra={400:"Bad path or type",404:"Unknown agent or task"}))
add("/file-safety/validate","post","May this agent write this file? Reason and recent modifications",tags=["file-safety"],body="ValidateBody",responses=resp(extra={400:"Bad path"}))
add("/file-safety/cleanup","post","Release expired and orphaned locks; drop modification records older than days (default 30)",tags=["file-safety"],body="FileCleanupBody",responses=resp(extra={400:"Bad days",403:"For the user only"}))
# the dashboard
def page(desc,media):
    return {"200":{"description":desc,"content":{media:{"schema":{"type":"string"}}}}}
add("/","get","The live web dashboard (HTML; strict Content-Security-Policy, no inline script); no auth",tags=["dashboard"],responses=page("The page","text/html"))
add("/dashboard/app.js","get","The dashboard's script; no auth",tags=["dashboard"],responses=page("The script","text/javascript"))
add("/dashboard/app.css","get","The dashboard's style sheet; no auth",tags=["dashboard"],responses=page("The style sheet","text/css"))
add("/dashboard/state","get","What the dashboard starts from: the head to follow /events from, the agents (as GET /agents, plus status_since_ms), log_started_ms (when the log's first event was written: tells this log from another answering at the port later), whether auth is on, and as_user: whether the page showed its key (or the API key) and may send and cancel",tags=["dashboard"],responses=resp())
add("/dashboard/page-key","get","The dashboard page's key, which synapse dashboard puts in the page's address (/?key=; a new key at every broker start) and the page sends as X-Synapse-Page-Key to act as the user; the user only, never a web page",tags=["broker"],responses=resp(schema={"type":"object","properties":{"key":{"type":"string"}}},extra={403:"not the user, or a request from a web page"}))
add("/dashboard/events","get","The event log a page at a time: the limit events before `before` (default: the newest), or after `after` (not both), oldest first, as envelopes in JSON; a page ends at about 4 MiB of message text (at least one event)",tags=["dashboard"],params=[q("before","integer","events with a smaller sequence number"),q("after","integer","events with a larger sequence number instead"),q("limit","integer","1..5000, default 200")],responses=resp(extra={400:"Bad query"}))
add("/dashboard/stream-token","post","A token that opens one /events stream (?token=) within 60 s, for a browser's EventSource, which cannot send a key; authenticated by the API key or, over the user's loopback connection, by the page key (X-Synapse-Page-Key), which passes authentication on every route",tags=["dashboard"],responses=resp(extra={401:"API key required or invalid",429:"Too many unspent tokens"}))
# per agent
add("/","post","A2A JSON-RPC 2.0 (v1.0: SendMessage, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask; 0.3 names without A2A-Version). "+A2A,tags=["a2a"],body="JsonRpcRequest",responses=resp(schema={"$ref":"#/components/schemas/JsonRpcResponse"}))
add("/status","get","READY / PROCESSING / WAITING and queue depth (open). "+A2A,tags=["a2a"])
add("/.well-known/agent.json","get","Synapse agent card (open). "+A2A,tags=["a2a"])
add("/.well-known/agent-card.json","get","A2A v1.0 agent card (open). "+A2A,tags=["a2a"])
add("/tasks/send","post","Send a message to this agent (priority 3) -> {task}. "+A2A,tags=["a2a"],body="A2aSendBody",responses=resp(extra={400:"Bad input",403:"Identity",413:"Too large"}))
add("/tasks/send-priority","post","Same with ?priority=1..5 (5 interrupts the CLI first). "+A2A,tags=["a2a"],params=[q("priority","integer")],body="A2aSendBody",responses=resp(extra={400:"Bad input or priority"}))
add("/tasks/create","post","Create a task owned by this agent without writing to its PTY (X-Synapse-Agent-Secret). "+A2A,tags=["a2a"],body="A2aSendBody",responses=resp(extra={400:"Bad input",403:"Secret"}))
add("/tasks","get","This agent's tasks. "+A2A,tags=["a2a"],params=[q("context_id"),q("state")])
add("/tasks/{id}/cancel","post","Cancel from submitted/working; other states 400. "+A2A,tags=["a2a"],params=pp("id"),responses=resp(extra=bad))
add("/tasks/{id}/subscribe","get","SSE of the task's status changes and artifacts; id = log sequence; Last-Event-ID resumes; ends after the final state. "+A2A,tags=["a2a"],params=pp("id"),responses={"200":{"description":"SSE stream","content":{"text/event-stream":{"schema":{"type":"string"}}}},"404":{"description":"Unknown task","content":{"application/json":{"schema":E}}}})
add("/reply-stack/list","get","Agents waiting for this agent's reply. "+A2A,tags=["a2a"])
add("/reply-stack/get","get","The newest reply target (or ?sender_id=); 404 No reply target. "+A2A,tags=["a2a"],params=[q("sender_id")],responses=resp(extra={404:"No reply target"}))
add("/reply-stack/pop","get","Same as get: the target leaves when the reply is posted (an event). "+A2A,tags=["a2a"],params=[q("sender_id")],responses=resp(extra={404:"No reply target"}))
S=lambda props,req=None:{"type":"object","properties":props,**({"required":req} if req else {})}
st={"type":"string"}; it={"type":"integer"}; bo={"type":"boolean"}
comps={
 "Error":S({"error":st,"message":st,"candidates":{"type":"array","items":st}},["error","message"]),
 "BrokerInfo":S({"pid":it,"version":st,"schema":it,"home":st,"socket":st,"port":it,"head":it,"build":{"type":"string","description":"the build the broker runs; a client of another build of the same version says so"}}),
 "RebuildReport":S({"events":it,"elapsed_ms":{"type":"number"}}),
 "IndexProgress":S({"indexed_through":it,"head":it,"segments":it}),
 "VerifyReport":S({"events":it,"differences":{"type":"array","items":st}}),
 "RegisterBody":S({"agent_type":st,"name":st,"role":st,"pid":it,"working_dir":st,"port":it,"port_range":{"type":"array","items":{"type":"integer","minimum":1,"maximum":65535},"minItems":2,"maxItems":2,"description":"[low, high]: without a port, the first free port of this range (its profile's); absent, the built-in range of agent_type. 1 <= low <= high, at most 1000 ports.","example":[8100,8109]}},["agent_type","pid"]),
 "Registration":S({"agent":{"type":"object"},"secret":st,"socket":st,"endpoint":st}),
 "StatusBody":S({"status":{"type":"string","enum":["READY","PROCESSING","WAITING"]}},["status"]),
 "SendRequest":S({"to":st,"from":st,"secret":st,"text":st,"priority":{"type":"integer","minimum":1,"maximum":5},"response_expected":bo,"reply_to":st,"context_id":st,"sender_task_id":st},["to","text"]),
 "ReplyBody":S({"from":st,"secret":st,"to":st,"text":st,"idempotency_key":{"type":"string","description":"As for a send: a retry with the same key within a day answers the first reply again and replies nothing"}},["from","text"]),
 "SendOutcome":S({"task":{"$ref":"#/components/schemas/Task"},"sender_task":{"$ref":"#/components/schemas/Task"},"is_reply":bo,"warning":st,"seq":it}),
 "Part":S({"type":{"type":"string","enum":["text","file","data"]},"text":st}),
 "Message":S({"role":{"type":"string","enum":["user","agent"]},"parts":{"type":"array","items":{"$ref":"#/components/schemas/Part"}}},["parts"]),
 "Task":S({"id":st,"context_id":st,"status":{"type":"string","enum":["submitted","working","input_required","completed","failed","canceled"]},"message":{"$ref":"#/components/schemas/Message"},"follow_ups":{"type":"array","items":{"$ref":"#/components/schemas/Message"},"description":"the messages after the first (A2A multi-turn follow-ups), in order; absent when none"},"artifacts":{"type":"array","items":{"type":"object"}},"error":st,"created_at":st,"updated_at":st,"metadata":{"type":"object"}}),
 "A2aSendBody":S({"message":{"$ref":"#/components/schemas/Message"},"metadata":S({"sender":S({"sender_id":st}),"response_expected":bo,"in_reply_to":st,"sender_task_id":st}),"context_id":st},["message"]),
 "UpdateTaskRequest":{"type":"object","description":"state (working, input_required, completed, failed, canceled), artifacts, error"},
 "JsonRpcRequest":S({"jsonrpc":{"type":"string","enum":["2.0"]},"id":{},"method":st,"params":{"type":"object"}},["jsonrpc","method"]),
 "JsonRpcResponse":S({"jsonrpc":st,"id":{},"result":{},"error":S({"code":it,"message":st,"data":{}})}),
 "ExternalAddBody":S({"url":st,"alias":st},["url"]),
 "ExternalSendBody":S({"text":st,"wait_seconds":it,"priority":{"type":"integer","minimum":1,"maximum":5,"description":"Sent with the remote's POST /tasks/send-priority?priority=N; absent: POST /tasks/send (priority 3)"},"response_expected":{"type":"boolean","description":"Ask the remote agent for a reply (default: only with wait_seconds)"}},["text"]),
 "LockBody":S({"path":st,"agent_id":st,"duration_seconds":it,"intent":st,"task_id":st,"wait_seconds":it},["path","agent_id"]),
 "UnlockBody":S({"path":st,"agent_id":st,"force":bo},["path"]),
 "RecordBody":S({"path":st,"agent_id":st,"task_id":st,"change_type":{"type":"string","enum":["CREATE","MODIFY","DELETE"]},"intent":st},["path","agent_id","task_id"]),
 "ValidateBody":S({"path":st,"agent_id":st},["path","agent_id"]),
 "HistoryCleanupBody":S({"days":it,"max_size_mb":it,"dry_run":bo}),
 "FileCleanupBody":S({"days":it}),
 "WebhookBody":S({"url":st,"events":{"type":"array","items":{"type":"string","enum":["task.completed","task.failed","task.canceled","task.replied"]}},"secret":st},["url"]),
}
doc={"openapi":"3.0.3","info":{"title":"Synapse broker and agent API","version":"0.1.0","description":"Every HTTP endpoint of Synapse. The broker serves its API on $SYNAPSE_UDS_DIR/broker.sock and 127.0.0.1:$SYNAPSE_BROKER_PORT; each agent's endpoints are served on its port and $SYNAPSE_UDS_DIR/<agent_id>.sock and under /agents/{agent} on the broker. Errors are JSON objects (Error) with a 4xx status for bad input. With SYNAPSE_AUTH_ENABLED=true every endpoint except agent cards and status needs X-API-Key or Authorization: Bearer."},
 "components":{"schemas":comps,"securitySchemes":{"apiKey":{"type":"apiKey","in":"header","name":"X-API-Key"},"bearer":{"type":"http","scheme":"bearer"}}},
 "paths":dict(sorted(P.items()))}
import sys
out=sys.argv[1] if len(sys.argv)>1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'schema', 'openapi.json')
open(out,'w').write(json.dumps(doc,indent=2)+"\n")
print(len(P),"paths")
