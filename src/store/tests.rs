use super::*;
use crate::event::*;
use proptest::prelude::*;
use redb::backends::InMemoryBackend;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn memory_store() -> Store {
    Store::open_with_backend(InMemoryBackend::new()).unwrap()
}

const AGENTS: [&str; 3] = ["synapse-dummy-8190", "synapse-dummy-8191", "synapse-claude-8100"];
const TASKS: [&str; 4] = [
    "0a000000-0000-4000-8000-000000000000",
    "0a000001-0000-4000-8000-000000000000",
    "0b000000-0000-4000-8000-000000000000",
    "0c000000-0000-4000-8000-000000000000",
];

fn agent() -> impl Strategy<Value = String> {
    prop::sample::select(AGENTS.to_vec()).prop_map(str::to_string)
}

fn task() -> impl Strategy<Value = String> {
    prop::sample::select(TASKS.to_vec()).prop_map(str::to_string)
}

fn state() -> impl Strategy<Value = TaskState> {
    prop::sample::select(TaskState::ALL.to_vec())
}

fn status() -> impl Strategy<Value = AgentStatus> {
    prop::sample::select(vec![AgentStatus::Starting, AgentStatus::Ready, AgentStatus::Processing, AgentStatus::Waiting])
}

/// Random events over a small universe of agents and tasks, so that they collide.
fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (agent(), 1u32..100_000, 8100u16..8200).prop_map(|(agent_id, pid, port)| Event::AgentRegistered {
            agent_type: "dummy".into(),
            agent_id,
            name: None,
            role: Some("tester".into()),
            pid,
            port,
            working_dir: "/tmp".into(),
            secret_hash: "00".into(),
            pid_start: Some(u64::from(pid) * 7),
            wrapper: pid % 2 == 0,
            resumes: false,
        }),
        (agent(), status()).prop_map(|(agent_id, status)| Event::AgentStatusChanged { agent_id, status, note: None }),
        agent().prop_map(|agent_id| Event::AgentDeregistered { agent_id, reason: "gone".into() }),
        agent().prop_map(|agent_id| Event::InboxExpired { agent_id, reason: "expired".into(), tickets: 1 }),
        (
            task(),
            prop::option::of(agent()),
            any::<bool>(),
            prop::option::of(task()),
            "[a-z ]{0,12}",
            prop::option::of(task()),
            prop::option::of(agent())
        )
            .prop_map(|(task_id, owner, incoming, sender_task_id, text, message_in, peer)| {
                Event::TaskCreated {
                    task_id,
                    owner,
                    context_id: "ctx".into(),
                    direction: if incoming { Direction::Incoming } else { Direction::Outgoing },
                    peer,
                    state: TaskState::Submitted,
                    priority: 3,
                    response_expected: true,
                    sender_task_id,
                    in_reply_to: None,
                    peer_task_id: None,
                    // A long message: the text is in the `message_sent` of `message_in`.
                    message: match message_in {
                        Some(_) => Message { role: Role::User, parts: Vec::new(), message_id: None },
                        None => Message::text(Role::User, text),
                    },
                    message_in,
                }
            }),
        (
            task(),
            prop::option::of(agent()),
            agent(),
            any::<bool>(),
            "[a-z ]{1,12}",
            prop::option::of("[a-c]{1,2}"),
            prop::option::of(task())
        )
            .prop_map(|(task_id, from, to, response_expected, text, idempotency_key, sender_task_id)| {
                Event::MessageSent {
                    task_id,
                    from,
                    to,
                    priority: 3,
                    response_expected,
                    sender_task_id,
                    in_reply_to: None,
                    text,
                    parts: Vec::new(),
                    by_user: response_expected,
                    unverified_sender: None,
                    sender_endpoint: None,
                    external_task_id: None,
                    idempotency_key,
                }
            }),
        (agent(), task(), 1u8..=5, prop::option::of(agent()), 0u32..3).prop_map(
            |(agent_id, task_id, priority, from, turn)| Event::TicketIssued {
                display_task_id: task_id.clone(),
                agent_id,
                task_id,
                priority,
                from,
                response_expected: false,
                turn,
            }
        ),
        // A follow-up, short or long (a long one is kept once, in the event).
        (
            task(),
            prop::option::of(task()),
            prop::option::of(agent()),
            agent(),
            prop::option::of("[a-z ]{1,12}"),
            prop::option::of("[a-c]{1,2}"),
            prop::option::of("[a-c]{1,2}")
        )
            .prop_map(|(task_id, sender_task_id, from, to, text, message_id, idempotency_key)| {
                Event::TaskContinued {
                    task_id,
                    sender_task_id,
                    from,
                    to,
                    text: text.unwrap_or_else(|| "long ".repeat(INLINE_TEXT_MAX_BYTES / 4)),
                    message_id,
                    idempotency_key,
                }
            }),
        (agent(), 1u64..40, 1u8..=5, 0u8..4).prop_map(|(agent_id, ticket, priority, how)| Event::TicketInjected {
            agent_id,
            ticket,
            priority,
            how: [None, Some(Delivery::Typed), Some(Delivery::HandedOver), Some(Delivery::Unwritten)][usize::from(how)],
        }),
        (task(), agent(), prop::option::of(agent()), prop::option::of("[a-c]{1,2}")).prop_map(
            |(task_id, from, to, idempotency_key)| Event::ReplyPosted {
                task_id,
                sender_task_id: None,
                from,
                to,
                text: "done".into(),
                idempotency_key,
            }
        ),
        (task(), agent(), "[a-z ]{1,12}").prop_map(|(task_id, from, text)| Event::ReplyPosted {
            task_id,
            sender_task_id: None,
            from,
            to: None,
            text,
            idempotency_key: None,
        }),
        (agent(), task(), agent()).prop_map(|(agent_id, task_id, from)| Event::ReverseTicketIssued {
            agent_id,
            task_id,
            from,
            priority: 3
        }),
        (task(), state(), prop::option::of(task())).prop_map(|(task_id, state, reply_of)| Event::TaskStateChanged {
            task_id,
            state,
            artifacts: vec![Artifact::text("out")],
            error: None,
            reply_of,
            as_message: false,
        }),
        (task(), prop::option::of(agent())).prop_map(|(task_id, by)| Event::TaskCanceled { task_id, reason: None, by }),
        (agent(), prop::sample::select(vec!["/tmp/a", "/tmp/b"])).prop_map(|(agent_id, path)| {
            Event::FileLockAcquired { path: path.into(), agent_id, expires_ms: 10, intent: None, task_id: None }
        }),
        (agent(), prop::sample::select(vec!["/tmp/a", "/tmp/b"]))
            .prop_map(|(agent_id, path)| Event::FileLockReleased { path: path.into(), agent_id, forced: false }),
        (0u64..3000).prop_map(|before_ms| Event::FileModificationsPruned { before_ms }),
        // Batches are written at 1_000 + their index: cut-offs inside that range drop some keys.
        (900u64..1_100).prop_map(|before_ms| Event::IdempotencyKeysExpired { before_ms }),
        (agent(), task()).prop_map(|(agent_id, task_id)| Event::FileModified {
            path: "/tmp/a".into(),
            agent_id,
            task_id,
            change_type: ChangeType::Modify,
            intent: None
        }),
        (1_000u64..1_012).prop_map(|before_ms| Event::HistoryPruned { before_ms, max_size_mb: None }),
    ]
}

/// Every projection row, for comparing whole states.
fn snapshot(store: &Store) -> Vec<String> {
    store
        .read(|view| {
            let mut rows = Vec::new();
            for agent in view.agents()? {
                rows.push(format!("{agent:?}"));
            }
            for task in view.tasks()? {
                rows.push(format!("{task:?}"));
            }
            for lock in view.locks()? {
                rows.push(format!("{lock:?}"));
            }
            for modification in view.recent_modifications(None, usize::MAX)? {
                rows.push(format!("{modification:?}"));
            }
            for record in view.history_records(None)? {
                rows.push(format!("{record:?}"));
            }
            for agent in AGENTS {
                for target in view.reply_targets(agent)? {
                    rows.push(format!("{target:?}"));
                }
                let tickets = view.inbox(agent, usize::MAX)?;
                // The kept depth is the number of tickets, live and after a replay.
                rows.push(format!("{agent} depth {} of {}", view.inbox_depth(agent)?, tickets.len()));
                assert_eq!(view.inbox_depth(agent)?, tickets.len(), "inbox depth of {agent}");
                for ticket in tickets {
                    rows.push(format!("{ticket:?}"));
                }
                for kind in [TaskIndexKind::Owned, TaskIndexKind::Served, TaskIndexKind::Working] {
                    let ids: Vec<String> = view.tasks_of(agent, kind)?.into_iter().map(|task| task.id).collect();
                    rows.push(format!("{agent} {kind:?}: {ids:?}"));
                }
                rows.push(format!("{agent} current: {:?}", view.current_task(agent)?.map(|task| task.id)));
            }
            Ok(rows)
        })
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn rebuilding_from_the_log_gives_exactly_the_live_projections(
        batches in prop::collection::vec(prop::collection::vec(event(), 1..8), 1..12)
    ) {
        let store = memory_store();
        for (index, batch) in batches.into_iter().enumerate() {
            store.transact(1_000 + index as u64, |appender| appender.append(Some("tester"), batch)).unwrap();
        }
        let live = snapshot(&store);
        let report = store.verify().unwrap();
        prop_assert!(report.differences.is_empty(), "{:?}", report.differences);
        prop_assert_eq!(report.events, store.event_count().unwrap());
        prop_assert_eq!(store.rebuild().unwrap().events, report.events);
        prop_assert_eq!(snapshot(&store), live);
        index_answers_as_a_scan_of_every_task(&store)?;
    }
}

/// The task index answers what a filter over every task answers: each agent's owned and
/// served tasks, and its current task (the newest working incoming one; ties to the greater id).
fn index_answers_as_a_scan_of_every_task(store: &Store) -> Result<(), TestCaseError> {
    let (indexed, scanned) = store
        .read(|view| {
            let all = view.tasks()?;
            let (mut indexed, mut scanned) = (Vec::new(), Vec::new());
            for agent in AGENTS {
                let ids = |tasks: Vec<TaskRecord>| tasks.into_iter().map(|task| task.id).collect::<Vec<_>>();
                let mut owned: Vec<&TaskRecord> = all.iter().filter(|t| t.owner.as_deref() == Some(agent)).collect();
                owned.sort_by_key(|task| task.created_seq);
                let mut served: Vec<&TaskRecord> =
                    all.iter().filter(|t| t.owner.is_none() && t.peer.as_deref() == Some(agent)).collect();
                served.sort_by_key(|task| task.created_seq);
                let mut working: Vec<&TaskRecord> = all
                    .iter()
                    .filter(|t| t.owner.as_deref() == Some(agent))
                    .filter(|t| t.state == TaskState::Working && t.direction == Direction::Incoming)
                    .collect();
                working.sort_by_key(|task| task.updated_ms);
                indexed.push((
                    ids(view.tasks_of(agent, TaskIndexKind::Owned)?),
                    ids(view.tasks_of(agent, TaskIndexKind::Served)?),
                    view.current_task(agent)?.map(|task| task.id),
                ));
                scanned.push((
                    owned.iter().map(|task| task.id.clone()).collect(),
                    served.iter().map(|task| task.id.clone()).collect(),
                    working.last().map(|task| task.id.clone()),
                ));
            }
            Ok((indexed, scanned))
        })
        .unwrap();
    prop_assert_eq!(indexed, scanned);
    Ok(())
}

/// An event that cannot be decoded, in the middle of a log that takes several chunks to read:
/// the rebuild and the check say so (and stop: no hang between the reading thread and the
/// applying one), and the live projections stay as they were.
#[test]
fn a_rebuild_stops_with_an_error_at_an_undecodable_event_and_keeps_the_live_projections() {
    let store = memory_store();
    for index in 0..20u64 {
        let status = if index % 2 == 0 { AgentStatus::Ready } else { AgentStatus::Processing };
        store
            .transact(index, |appender| {
                appender.append(None, vec![Event::AgentStatusChanged { agent_id: "a".into(), status, note: None }])
            })
            .unwrap();
    }
    let live = snapshot(&store);
    let txn = store.db().unwrap().begin_write().unwrap();
    txn.open_table(LOG).unwrap().insert(9, b"\xc1 not an event".as_slice()).unwrap();
    txn.commit().unwrap();
    assert!(store.rebuild().is_err());
    assert!(store.verify().is_err());
    assert_eq!(snapshot(&store), live);
}

#[test]
fn verify_reports_a_projection_that_drifted_from_the_log() {
    let store = memory_store();
    store
        .transact(5, |appender| {
            appender.append(
                None,
                vec![Event::AgentStatusChanged { agent_id: "nobody".into(), status: AgentStatus::Ready, note: None }],
            )
        })
        .unwrap();
    // Write a projection row that no event explains.
    let txn = store.db().unwrap().begin_write().unwrap();
    {
        let mut agents = txn.open_table(LIVE.agents).unwrap();
        agents.insert("ghost", b"not a row".as_slice()).unwrap();
    }
    txn.commit().unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.events, 1);
    assert_eq!(report.differences.len(), 1, "{:?}", report.differences);
    assert!(report.differences[0].contains("ghost"));
    // verify wrote nothing: the drift is still there, and rebuild removes it.
    assert!(!store.verify().unwrap().differences.is_empty());
    store.rebuild().unwrap();
    assert!(store.verify().unwrap().differences.is_empty());
}

#[test]
fn verify_reports_a_task_index_that_drifted_and_rebuild_restores_it() {
    let store = memory_store();
    let task_id = "0a000000-0000-4000-8000-000000000000";
    store.transact(1_000, |appender| appender.append(None, vec![alice_asks_bob(task_id, "hello")])).unwrap();
    let owner = store.read(|view| view.task(task_id)).unwrap().unwrap().owner.unwrap();
    assert_eq!(store.read(|view| view.tasks_of(&owner, TaskIndexKind::Owned)).unwrap().len(), 1);
    // Lose the index rows, as a bug in `apply` would.
    let txn = store.db().unwrap().begin_write().unwrap();
    txn.delete_table(LIVE.task_index).unwrap();
    txn.open_table(LIVE.task_index).unwrap();
    txn.commit().unwrap();
    assert!(store.read(|view| view.tasks_of(&owner, TaskIndexKind::Owned)).unwrap().is_empty());
    let report = store.verify().unwrap();
    assert!(report.differences.iter().any(|line| line.starts_with("task_index")), "{:?}", report.differences);
    store.rebuild().unwrap();
    assert!(store.verify().unwrap().differences.is_empty());
    assert_eq!(store.read(|view| view.tasks_of(&owner, TaskIndexKind::Owned)).unwrap().len(), 1);
}

#[test]
fn sequence_numbers_start_at_one_and_have_no_gaps_across_transactions() {
    let store = memory_store();
    for round in 0..3 {
        store
            .transact(round, |appender| {
                appender.append(None, vec![Event::AgentDeregistered { agent_id: "a".into(), reason: "x".into() }; 2])
            })
            .unwrap();
    }
    let events = store.read_after(0, 100).unwrap();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(store.head().unwrap(), 6);
    assert_eq!(store.read_after(4, 100).unwrap().len(), 2);
    assert_eq!(store.read_after(6, 100).unwrap().len(), 0);
}

/// A read for the tails stops at the event that brings their texts to the bound (at least one
/// event, however long): a tail far behind a log of long messages read up to a thousand of them
/// at once, each with its text.
#[test]
fn a_read_stops_at_the_event_that_brings_its_texts_to_the_bound() {
    let store = memory_store();
    let asked: Vec<Event> = (0..6u64).map(|n| alice_asks_bob(&format!("task-{n}"), &"x".repeat(1_000))).collect();
    store.transact(1_000, |appender| appender.append(None, asked)).unwrap();
    let seqs = |events: Vec<Envelope>| events.iter().map(|envelope| envelope.seq).collect::<Vec<_>>();
    assert_eq!(seqs(store.read_after_within(0, 100, 2_500).unwrap()), [1, 2, 3]);
    assert_eq!(seqs(store.read_after_within(3, 100, 2_000).unwrap()), [4, 5]);
    assert_eq!(seqs(store.read_after_within(0, 100, 10).unwrap()), [1], "at least one, however long");
    assert_eq!(seqs(store.read_after_within(5, 100, 10).unwrap()), [6]);
    assert_eq!(seqs(store.read_after_within(0, 2, 1 << 20).unwrap()), [1, 2], "and at most the limit");
    assert_eq!(store.read_after(0, 100).unwrap().len(), 6);
    // Backwards (the dashboard's pages), the newest first, from `first` up to `before`.
    assert_eq!(seqs(store.read_back_within(1, 7, 2_500).unwrap()), [6, 5, 4]);
    assert_eq!(seqs(store.read_back_within(2, 4, 1 << 20).unwrap()), [3, 2], "within the range");
    assert_eq!(seqs(store.read_back_within(1, 7, 10).unwrap()), [6], "at least one, however long");
    assert!(store.read_back_within(4, 4, 1 << 20).unwrap().is_empty());
}

#[test]
fn a_failed_transaction_leaves_neither_events_nor_projection_changes() {
    let store = memory_store();
    let result: Result<(), StoreError> = store.transact(1, |appender| {
        appender.append(
            None,
            vec![Event::AgentStatusChanged { agent_id: "a".into(), status: AgentStatus::Ready, note: None }],
        )?;
        Err(StoreError::Storage("injected".into()))
    });
    assert!(result.is_err());
    assert_eq!(store.head().unwrap(), 0);
}

#[test]
fn inbox_is_ordered_by_priority_then_arrival() {
    let store = memory_store();
    let ticket = |priority: u8, task: &str| Event::TicketIssued {
        agent_id: "b".into(),
        task_id: task.into(),
        priority,
        from: None,
        display_task_id: task.into(),
        response_expected: false,
        turn: 0,
    };
    store
        .transact(1, |appender| {
            appender.append(None, vec![ticket(1, "low"), ticket(3, "mid-1"), ticket(5, "urgent"), ticket(3, "mid-2")])
        })
        .unwrap();
    let order: Vec<String> =
        store.read(|view| view.inbox("b", 10)).unwrap().into_iter().map(|ticket| ticket.task_id).collect();
    assert_eq!(order, vec!["urgent", "mid-1", "mid-2", "low"]);
}

/// The kept inbox depth follows every way a ticket comes and goes (issued, written, dropped
/// with its canceled task, the same ticket number twice), and a replay keeps the same rows.
#[test]
fn the_inbox_depth_follows_the_inbox_and_survives_a_rebuild() {
    let store = memory_store();
    let ticket = |task: &str| Event::TicketIssued {
        agent_id: "bob".into(),
        task_id: task.into(),
        priority: 3,
        from: None,
        display_task_id: task.into(),
        response_expected: false,
        turn: 0,
    };
    let mut owned_by_bob = alice_asks_bob("t-canceled", "x");
    if let Event::TaskCreated { owner, .. } = &mut owned_by_bob {
        *owner = Some("bob".into());
    }
    let depth = |store: &Store| store.read(|view| view.inbox_depth("bob")).unwrap();
    // Seqs 1-4: the task, then three tickets (numbers 2, 3, 4).
    store
        .transact(1, |appender| {
            appender.append(None, vec![owned_by_bob, ticket("t-canceled"), ticket("t-written"), ticket("t-waits")])
        })
        .unwrap();
    assert_eq!(depth(&store), 3);
    let written = Event::TicketInjected { agent_id: "bob".into(), ticket: 3, priority: 3, how: None };
    store.transact(2, |appender| appender.append(None, vec![written.clone()])).unwrap();
    assert_eq!(depth(&store), 2);
    // Written again (a wrapper restarted): nothing more leaves.
    store.transact(3, |appender| appender.append(None, vec![written])).unwrap();
    assert_eq!(depth(&store), 2);
    let canceled = Event::TaskCanceled { task_id: "t-canceled".into(), reason: None, by: None };
    store.transact(4, |appender| appender.append(None, vec![canceled])).unwrap();
    assert_eq!(depth(&store), 1);
    assert_eq!(store.read(|view| view.inbox("bob", 10)).unwrap().len(), 1);
    assert!(store.verify().unwrap().differences.is_empty());
    store.rebuild().unwrap();
    assert_eq!(depth(&store), 1);
    let last = Event::TicketInjected { agent_id: "bob".into(), ticket: 4, priority: 3, how: None };
    store.transact(5, |appender| appender.append(None, vec![last])).unwrap();
    assert_eq!(depth(&store), 0);
    assert!(store.verify().unwrap().differences.is_empty(), "an empty inbox has no depth row, as after a replay");
}

/// A backend that fails every write with "no space left on device" while `full` is set.
#[derive(Debug)]
struct FullDisk {
    inner: InMemoryBackend,
    full: Arc<AtomicBool>,
}

impl redb::StorageBackend for FullDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        if self.full.load(Ordering::SeqCst) && len > self.inner.len()? {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        if self.full.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        if self.full.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.write(offset, data)
    }
}

/// A backend whose fsync panics while `panic` is set: a commit that fails other than by I/O.
#[derive(Debug)]
struct PanickingSync {
    inner: InMemoryBackend,
    panic: Arc<AtomicBool>,
}

impl redb::StorageBackend for PanickingSync {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        assert!(!self.panic.swap(false, Ordering::SeqCst), "a commit that fails other than by I/O");
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.inner.write(offset, data)
    }
}

#[test]
fn after_a_commit_that_failed_other_than_by_io_every_write_asks_for_a_reopen() {
    let panic = Arc::new(AtomicBool::new(false));
    let store =
        Store::open_with_backend(PanickingSync { inner: InMemoryBackend::new(), panic: panic.clone() }).unwrap();
    store.transact(1, |appender| appender.append(None, small_batch())).unwrap();
    panic.store(true, Ordering::SeqCst);
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.transact(2, |appender| appender.append(None, small_batch()))
    }));
    assert!(failed.is_err(), "the commit panicked");
    // redb has discarded its allocator state: it refuses every write, with an error that must
    // make the broker reopen the database (the writer, the indexer and the delivery worker ask
    // `refuses_until_reopened`).
    let refused = store.transact(3, |appender| appender.append(None, small_batch())).unwrap_err();
    assert!(matches!(refused, StoreError::MustReopen(_)), "{refused:?}");
    assert!(refused.refuses_until_reopened());
    assert!(refused.to_string().contains("must be reopened"), "{refused}");
}

#[test]
fn a_full_disk_is_reported_clearly_and_nothing_half_written_is_acknowledged() {
    let full = Arc::new(AtomicBool::new(false));
    let store = Store::open_with_backend(FullDisk { inner: InMemoryBackend::new(), full: full.clone() }).unwrap();
    let event = || vec![Event::AgentStatusChanged { agent_id: "a".into(), status: AgentStatus::Ready, note: None }];
    store.transact(1, |appender| appender.append(None, event())).unwrap();
    full.store(true, Ordering::SeqCst);
    let error = store.transact(2, |appender| appender.append(None, event())).unwrap_err();
    assert!(matches!(error, StoreError::DiskFull(_)), "{error:?}");
    assert!(error.to_string().contains("disk is full"));
    full.store(false, Ordering::SeqCst);
    // redb may need a fresh transaction after an I/O failure; either way the failed event is
    // not in the log.
    let events = store.read_after(0, 10);
    if let Ok(events) = events {
        assert_eq!(events.len(), 1);
    }
}

#[test]
fn pruning_file_modifications_drops_only_the_older_records() {
    let store = memory_store();
    let modified = |path: &str| Event::FileModified {
        path: path.into(),
        agent_id: "a".into(),
        task_id: "t".into(),
        change_type: ChangeType::Modify,
        intent: None,
    };
    store.transact(1_000, |appender| appender.append(None, vec![modified("/old")])).unwrap();
    store.transact(5_000, |appender| appender.append(None, vec![modified("/new")])).unwrap();
    store
        .transact(6_000, |appender| appender.append(None, vec![Event::FileModificationsPruned { before_ms: 2_000 }]))
        .unwrap();
    let left: Vec<String> =
        store.read(|view| view.recent_modifications(None, 10)).unwrap().into_iter().map(|m| m.path).collect();
    assert_eq!(left, vec!["/new".to_string()]);
    assert!(store.verify().unwrap().differences.is_empty());
}

// ---------------------------------------------------------------------------------------------
// History search: the scan against a naive filter, and the index against the scan.

/// Texts over few letters and both cases, so that keywords and words collide often.
fn search_text() -> impl Strategy<Value = String> {
    "[abAB ,Ωω]{0,14}"
}

/// Events that change what a search sees, mixed with every other kind.
fn search_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        1 => event(),
        2 => (task(), prop::option::of(agent()), prop::option::of(agent()), any::<bool>(), search_text(), context()).prop_map(
            |(task_id, owner, peer, incoming, text, context_id)| Event::TaskCreated {
                task_id,
                owner,
                context_id,
                direction: if incoming { Direction::Incoming } else { Direction::Outgoing },
                peer,
                state: TaskState::Submitted,
                message: Message::text(Role::User, text),
                priority: 3,
                response_expected: false,
                sender_task_id: None,
                in_reply_to: None,
                peer_task_id: None,
                message_in: None,
            }
        ),
        2 => (task(), state(), search_text()).prop_map(|(task_id, state, text)| Event::TaskStateChanged {
            task_id,
            state,
            artifacts: vec![Artifact::text(text)],
            error: None,
            reply_of: None,
            as_message: false,
        }),
    ]
}

/// Conversations: a task created again may change its own.
fn context() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["ctx".to_string(), "other".to_string(), String::new()])
}

fn search_keywords() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[abAB ,Ωω]{1,4}", 1..4)
}

/// The search, written as plainly as possible: every record whose input, follow-up messages
/// or output hold the keyword's characters, each on a character of the same case-folding and
/// the same kind (letter or digit, or not), starting where a word starts unless the keyword
/// starts with a character that is no letter or digit. A keyword without a letter or digit
/// matches nothing.
fn naive_search(
    store: &Store,
    keywords: &[String],
    logic: history::Logic,
    case_sensitive: bool,
    agent: Option<&str>,
    limit: usize,
) -> Vec<history::HistoryRecord> {
    let fold = |c: char| -> String { if case_sensitive { c.to_string() } else { c.to_lowercase().collect() } };
    let same = |left: char, right: char| fold(left) == fold(right) && left.is_alphanumeric() == right.is_alphanumeric();
    let mut found: Vec<history::HistoryRecord> = store
        .read(|view| view.history_records(agent))
        .unwrap()
        .into_iter()
        .filter(|record| {
            // The record shows the first message only; the follow-ups are on its task.
            let task = store.read(|view| view.task(&record.task_id)).unwrap().unwrap();
            let mut text = record.input.clone();
            for follow_up in &task.follow_ups {
                text = format!("{text}\n{}", follow_up.message.joined_text());
            }
            let text: Vec<char> = format!("{text}\n{}", record.output).chars().collect();
            let has = |keyword: &String| {
                let keyword: Vec<char> = keyword.chars().collect();
                let starts_anywhere = !keyword[0].is_alphanumeric();
                keyword.iter().any(|c| c.is_alphanumeric())
                    && (0..text.len()).any(|at| {
                        (starts_anywhere || at == 0 || !text[at - 1].is_alphanumeric())
                            && text.len() - at >= keyword.len()
                            && keyword.iter().zip(&text[at..]).all(|(&k, &t)| same(k, t))
                    })
            };
            match logic {
                history::Logic::Or => keywords.iter().any(has),
                history::Logic::And => keywords.iter().all(has),
            }
        })
        .collect();
    found.truncate(limit);
    found
}

fn logic() -> impl Strategy<Value = history::Logic> {
    prop::sample::select(vec![history::Logic::Or, history::Logic::And])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn history_search_equals_a_naive_filter(
        batches in prop::collection::vec(prop::collection::vec(search_event(), 1..8), 1..10),
        keywords in search_keywords(),
        logic in logic(),
        case_sensitive in any::<bool>(),
        agent in prop::option::of(agent()),
        limit in 1usize..20,
    ) {
        let store = memory_store();
        for (index, batch) in batches.into_iter().enumerate() {
            store.transact(1_000 + index as u64, |appender| appender.append(Some("tester"), batch)).unwrap();
        }
        let expected = naive_search(&store, &keywords, logic, case_sensitive, agent.as_deref(), limit);
        let found = store
            .read(|view| view.search_history(&keywords, logic, case_sensitive, agent.as_deref(), limit))
            .unwrap();
        prop_assert_eq!(found, expected);
    }

    /// Whatever part of the log the indexer has reached (none, some steps, all, after a rebuild),
    /// the indexed search answers exactly what the scan answers.
    #[test]
    fn indexed_history_search_equals_the_scan(
        batches in prop::collection::vec(
            (prop::collection::vec(search_event(), 1..8), prop::option::weighted(0.7, 1usize..6)),
            1..10,
        ),
        keywords in search_keywords(),
        logic in logic(),
        case_sensitive in any::<bool>(),
        agent in prop::option::of(agent()),
        limit in 1usize..20,
        rebuild in any::<bool>(),
    ) {
        let store = memory_store();
        for (index, (batch, index_step)) in batches.into_iter().enumerate() {
            store.transact(1_000 + index as u64, |appender| appender.append(Some("tester"), batch)).unwrap();
            if let Some(events) = index_step {
                store.index_history_step(events).unwrap();
            }
        }
        let search = |store: &Store| {
            let scanned = store
                .read(|view| view.search_history(&keywords, logic, case_sensitive, agent.as_deref(), limit))
                .unwrap();
            let indexed = store.search_history(&keywords, logic, case_sensitive, agent.as_deref(), limit).unwrap();
            // Keywords common from so many bytes of posting lists: none (a huge threshold),
            // some or all of them; the walk of the newest tasks may finish, or is cut off after
            // one or no task and falls back on the lists.
            for common_posting_bytes in [usize::MAX, 8, 4, 2, 1, 0] {
                for walk_budget in [usize::MAX, 1, 0] {
                    let tuning = crate::store::search_index::SearchTuning { common_posting_bytes, walk_budget };
                    let tuned = store
                        .search_history_tuned(&keywords, logic, case_sensitive, agent.as_deref(), limit, tuning)
                        .unwrap();
                    assert_eq!(tuned, scanned, "common from {common_posting_bytes} bytes, walk budget {walk_budget}");
                }
            }
            let mut listed = store.read(|view| view.history_records(agent.as_deref())).unwrap();
            listed.truncate(limit);
            let recent = store.recent_history(agent.as_deref(), limit).unwrap();
            // Each task's conversation, and prefixes that name several tasks or none.
            let references = TASKS.iter().copied().chain(["0a", "0", "ff"]);
            let threads_scanned: Vec<_> =
                references.clone().map(|task| store.read(|view| view.thread_of(task)).unwrap()).collect();
            let threads_indexed: Vec<_> = references.map(|task| store.thread_of(task).unwrap()).collect();
            ((scanned, listed, threads_scanned), (indexed, recent, threads_indexed))
        };
        let (scanned, indexed) = search(&store);
        prop_assert_eq!(&indexed, &scanned, "partly indexed");
        store.index_history().unwrap();
        let (scanned, indexed) = search(&store);
        prop_assert_eq!(&indexed, &scanned, "fully indexed");
        if rebuild {
            store.rebuild().unwrap();
            prop_assert_eq!(store.index_progress().unwrap().indexed_through, 0, "a rebuild empties the index");
            store.index_history_step(3).unwrap();
            let (scanned, indexed) = search(&store);
            prop_assert_eq!(&indexed, &scanned, "after a rebuild");
        }
    }
}

/// Alice's own task for a question to bob.
fn alice_asks_bob(task_id: &str, text: &str) -> Event {
    Event::TaskCreated {
        task_id: task_id.into(),
        owner: Some("alice".into()),
        context_id: "ctx".into(),
        direction: Direction::Outgoing,
        peer: Some("bob".into()),
        state: TaskState::Submitted,
        message: Message::text(Role::User, text),
        priority: 3,
        response_expected: true,
        sender_task_id: None,
        in_reply_to: None,
        peer_task_id: None,
        message_in: None,
    }
}

#[test]
fn the_index_keeps_few_segments_and_finds_words_by_prefix() {
    let store = memory_store();
    for n in 0..300u64 {
        let event = alice_asks_bob(&format!("task-{n:04}"), &format!("Parser number{n} ready"));
        store.transact(1_000 + n, |appender| appender.append(None, vec![event])).unwrap();
        store.index_history_step(1).unwrap();
    }
    let progress = store.index_progress().unwrap();
    assert!(progress.caught_up());
    // Segments merge like a binary counter: at most log2(postings) + 1 of them.
    assert!(progress.segments <= 11, "{progress:?}");
    let keywords = |words: &[&str]| words.iter().map(|word| word.to_string()).collect::<Vec<_>>();
    let found = store.search_history(&keywords(&["number12"]), history::Logic::Or, false, None, 100).unwrap();
    let ids: Vec<&str> = found.iter().map(|record| record.task_id.as_str()).collect();
    assert_eq!(ids.len(), 11, "number12 and number120..129: {ids:?}");
    let both = store.search_history(&keywords(&["PARS", "number7"]), history::Logic::And, false, None, 5).unwrap();
    assert_eq!(both.len(), 5);
    assert!(both.iter().all(|record| record.input.contains("number7")));
    assert!(store.search_history(&keywords(&["pars"]), history::Logic::Or, true, None, 5).unwrap().is_empty());
    assert_eq!(store.verify().unwrap().differences, Vec::<String>::new());
}

/// `synapse admin index` on a broker that begins to stop ends: once indexing is stopped, a
/// step indexes nothing, so `index_history` answers the progress so far instead of stepping for
/// ever towards a head it can no longer reach (it kept the stopping broker alive, a core busy).
#[test]
fn indexing_the_history_ends_once_indexing_is_stopped() {
    let store = Arc::new(memory_store());
    let created: Vec<Event> = (0..10u64).map(|n| alice_asks_bob(&format!("task-{n:02}"), "parser note")).collect();
    store.transact(1_000, |appender| appender.append(None, created)).unwrap();
    store.stop_indexing();
    let (done, finished) = std::sync::mpsc::channel();
    let indexing = Arc::clone(&store);
    std::thread::spawn(move || done.send(indexing.index_history()));
    let progress = finished
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("index_history goes on once indexing is stopped")
        .unwrap();
    assert!(!progress.caught_up(), "{progress:?}");
    assert_eq!(progress.indexed_through, 0, "{progress:?}");
}

/// An event that only moves a task on (its state, a cancel) adds nothing to the index: its
/// words are posted already. The step still moves the task up in recency. One that brings a
/// text (an output) posts the task again.
#[test]
fn a_state_change_alone_posts_no_words_again() {
    let store = memory_store();
    let created: Vec<Event> =
        (0..40u64).map(|n| alice_asks_bob(&format!("task-{n:02}"), &format!("parser note{n} ready"))).collect();
    store.transact(1_000, |appender| appender.append(None, created)).unwrap();
    let progress = store.index_history().unwrap();
    assert_eq!(progress.segments, 1, "{progress:?}");
    let moved_on = |n: u64| Event::TaskStateChanged {
        task_id: format!("task-{n:02}"),
        state: TaskState::Working,
        artifacts: Vec::new(),
        error: None,
        reply_of: None,
        as_message: false,
    };
    store.transact(2_000, |appender| appender.append(None, vec![moved_on(7)])).unwrap();
    let canceled = Event::TaskCanceled { task_id: "task-03".into(), reason: Some("zebra".into()), by: None };
    store.transact(3_000, |appender| appender.append(None, vec![canceled])).unwrap();
    for _ in 0..2 {
        // One task's words are fewer postings than the first segment's: they would not merge.
        let progress = store.index_history_step(1).unwrap();
        assert_eq!(progress.segments, 1, "a segment for words already posted: {progress:?}");
    }
    assert!(store.index_progress().unwrap().caught_up());
    let newest: Vec<String> = store.recent_history(None, 3).unwrap().into_iter().map(|record| record.task_id).collect();
    assert_eq!(newest[..2], ["task-03".to_string(), "task-07".to_string()]);
    let keywords = |word: &str| vec![word.to_string()];
    let found = store.search_history(&keywords("note7"), history::Logic::Or, false, None, 10).unwrap();
    assert_eq!(found.iter().map(|record| record.task_id.as_str()).collect::<Vec<_>>(), ["task-07"]);
    assert_eq!(found[0].status, TaskState::Working);
    // An error is not searched: the cancel's reason is no word of the task.
    assert!(store.search_history(&keywords("zebra"), history::Logic::Or, false, None, 10).unwrap().is_empty());

    let answered = Event::TaskStateChanged {
        task_id: "task-07".into(),
        state: TaskState::Completed,
        artifacts: vec![Artifact::text("quokka")],
        error: None,
        reply_of: None,
        as_message: false,
    };
    store.transact(4_000, |appender| appender.append(None, vec![answered])).unwrap();
    assert_eq!(store.index_history_step(1).unwrap().segments, 2, "an output is posted");
    let found = store.search_history(&keywords("quokka"), history::Logic::Or, false, None, 10).unwrap();
    assert_eq!(found.iter().map(|record| record.task_id.as_str()).collect::<Vec<_>>(), ["task-07"]);
    assert_eq!(store.verify().unwrap().differences, Vec::<String>::new());
}

/// A store whose projections were written by an older build (task records without
/// `created_seq`) is replayed when opened, so the history index can number every task.
#[test]
fn projections_of_an_older_shape_are_replayed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("synapse.redb");
    let task_id = "0a000000-0000-4000-8000-000000000000";
    {
        let store = Store::open(&path).unwrap();
        let created = alice_asks_bob(task_id, "legacy parser note");
        store.transact(1_000, |appender| appender.append(None, vec![created])).unwrap();
        // What the previous build left: no projection version, a task without its number.
        let txn = store.db().unwrap().begin_write().unwrap();
        {
            txn.open_table(META).unwrap().remove(META_PROJECTIONS).unwrap();
            let mut projections = Projections::open(&txn, &LIVE).unwrap();
            let mut task = projections.task(task_id).unwrap().unwrap();
            let was = super::projection::task_index_rows(&task);
            task.created_seq = 0;
            projections.put_task(task, &was).unwrap();
        }
        txn.commit().unwrap();
        let task = store.read(|view| view.task(task_id)).unwrap().unwrap();
        assert_eq!(task.created_seq, 0);
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.read(|view| view.task(task_id)).unwrap().unwrap().created_seq, 1);
    store.index_history().unwrap();
    let found = store.search_history(&["parser".to_string()], history::Logic::Or, false, None, 10).unwrap();
    assert_eq!(found.len(), 1);
    assert!(store.verify().unwrap().differences.is_empty());
}

/// An indexer far behind (more unindexed events than a search reads itself): the search scans
/// the tasks instead, and answers the same.
#[test]
fn a_search_far_ahead_of_the_indexer_scans_and_answers_the_same() {
    let store = memory_store();
    let task = |n: usize, text: &str| alice_asks_bob(&format!("task-{n}"), text);
    store.transact(1_000, |appender| appender.append(None, vec![task(1, "parser first")])).unwrap();
    store.index_history().unwrap();
    let mut events: Vec<Event> =
        (0..search_index::TAIL_LIMIT).map(|_| Event::FileModificationsPruned { before_ms: 0 }).collect();
    events.push(task(2, "parser second"));
    store.transact(2_000, |appender| appender.append(None, events)).unwrap();
    let keywords = vec!["parser".to_string()];
    let found = store.search_history(&keywords, history::Logic::Or, false, None, 10).unwrap();
    let scanned = store.read(|view| view.search_history(&keywords, history::Logic::Or, false, None, 10)).unwrap();
    assert_eq!(found, scanned);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(store.recent_history(None, 10).unwrap().len(), 2);
    // The conversation, from the index and the far tail: a scan.
    let thread = store.thread_of("task-1").unwrap().unwrap();
    assert_eq!(thread, store.read(|view| view.thread_of("task-1")).unwrap().unwrap());
    assert_eq!(thread.len(), 2, "{thread:?}");
}

/// A store on a simulated disk that is full while the returned switch file exists.
fn store_on_a_disk_that_fills() -> (tempfile::TempDir, std::path::PathBuf, Store) {
    let dir = tempfile::tempdir().unwrap();
    let switch = dir.path().join("disk-full");
    let store = Store::open_with_disk_full_switch(&dir.path().join("log.redb"), Some(&switch)).unwrap();
    (dir, switch, store)
}

fn small_batch() -> Vec<Event> {
    vec![Event::AgentStatusChanged { agent_id: "a".into(), status: AgentStatus::Ready, note: None }]
}

/// Larger than the file: committing it needs the file to grow.
fn large_batch() -> Vec<Event> {
    vec![Event::AgentStatusChanged { agent_id: "b".repeat(8 << 20), status: AgentStatus::Ready, note: None }]
}

#[test]
fn a_store_reopened_after_a_full_disk_keeps_every_commit_and_writes_again_when_space_returns() {
    let (_dir, switch, store) = store_on_a_disk_that_fills();
    let (small, large) = (small_batch, large_batch);
    store.transact(1, |appender| appender.append(None, small())).unwrap();
    // The write-ahead log grows to hold it, and keeps that room after the checkpoint.
    store.transact(2, |appender| appender.append(None, large())).unwrap();
    // Durable in the database itself, not only in the write-ahead log.
    store.checkpoint().unwrap();
    assert!(!store.checkpoint_pending());

    std::fs::write(&switch, b"").unwrap();
    // The log has room for it; the database needs new blocks.
    let error = store.transact(3, |appender| appender.append(None, large())).unwrap_err();
    assert!(error.is_io_failure(), "{error:?}");
    // redb refuses the database after a failed commit, reads included, until it is reopened.
    let refused = store.head().unwrap_err();
    assert!(refused.is_io_failure(), "{refused:?}");
    store.reopen(&error.to_string()).unwrap();
    assert_eq!(store.head().unwrap(), 2, "the committed events are there, the failed one is not");

    std::fs::remove_file(&switch).unwrap();
    store.transact(4, |appender| appender.append(None, large())).unwrap();
    assert_eq!(store.head().unwrap(), 3);
    assert!(store.verify().unwrap().differences.is_empty());
}

#[test]
fn a_write_after_a_failed_one_hears_the_cause_not_only_that_an_earlier_write_failed() {
    let (_dir, switch, store) = store_on_a_disk_that_fills();
    store.transact(1, |appender| appender.append(None, small_batch())).unwrap();
    store.transact(2, |appender| appender.append(None, large_batch())).unwrap();
    store.checkpoint().unwrap();

    std::fs::write(&switch, b"").unwrap();
    let first = store.transact(3, |appender| appender.append(None, large_batch())).unwrap_err();
    assert!(matches!(first, StoreError::DiskFull(_)), "{first:?}");
    // The next write (the writer's batch after the history indexer's failed step, say) gets
    // only redb's "Previous I/O error occurred"; it must say what failed.
    let next = store.transact(4, |appender| appender.append(None, small_batch())).unwrap_err();
    assert!(matches!(next, StoreError::DiskFull(_)), "{next:?}");
    assert!(next.to_string().contains("disk is full"), "{next}");
    let checkpoint = store.checkpoint().unwrap_err();
    assert!(matches!(checkpoint, StoreError::DiskFull(_)), "{checkpoint:?}");
    let read = store.head().unwrap_err();
    assert!(matches!(read, StoreError::DiskFull(_)), "{read:?}");
    let noted = || store.source.as_ref().and_then(|source| source.failure.get());
    assert!(matches!(noted(), Some(super::failure::Cause::DiskFull(_))), "{:?}", noted());

    // Reopened, with space again: the cause is forgotten and writes go on.
    std::fs::remove_file(&switch).unwrap();
    store.reopen(&first.to_string()).unwrap();
    assert_eq!(noted(), None);
    store.transact(5, |appender| appender.append(None, small_batch())).unwrap();
    assert_eq!(store.head().unwrap(), 3);
}

#[test]
fn a_batch_only_the_write_ahead_log_holds_survives_a_failed_batch_and_the_reopen() {
    let (_dir, switch, store) = store_on_a_disk_that_fills();
    let (small, large) = (small_batch, large_batch);
    store.transact(1, |appender| appender.append(None, small())).unwrap();
    assert!(store.checkpoint_pending(), "durable in the write-ahead log only");

    std::fs::write(&switch, b"").unwrap();
    let error = store.transact(2, |appender| appender.append(None, large())).map(|_| ()).unwrap_err();
    assert!(error.is_io_failure(), "{error}");
    // The reopened database starts from its last durable commit, without the first batch: it
    // takes it back from the log, which may need room; until then nothing is read from it.
    if let Err(reopen_error) = store.reopen(&error.to_string()) {
        assert!(reopen_error.is_io_failure(), "{reopen_error}");
        // Reads are refused until the reopen succeeds, with the failure that called for it.
        let refused = store.head().unwrap_err();
        assert!(matches!(refused, StoreError::Reopening(_)), "{refused:?}");
        assert!(refused.to_string().contains("the disk is full"), "{refused}");
        std::fs::remove_file(&switch).unwrap();
        store.reopen("a test").unwrap();
    } else {
        std::fs::remove_file(&switch).unwrap();
    }
    assert_eq!(store.head().unwrap(), 1, "the acknowledged batch is there, the failed one is not");
    store.transact(3, |appender| appender.append(None, large())).map(|_| ()).unwrap();
    assert_eq!(store.head().unwrap(), 2);
    assert!(store.verify().unwrap().differences.is_empty());
}

/// The events a send of a long text with a reply expected and its reply append (see
/// `broker::command`): the text is in `message_sent` and `reply_posted` only.
fn long_exchange(text: &str, reply: &str) -> (Vec<Event>, Vec<Event>) {
    let (sender_task, receiver_task) = (TASKS[0].to_string(), TASKS[1].to_string());
    let created = |task_id: &str, owner: &str, direction: Direction| Event::TaskCreated {
        task_id: task_id.into(),
        owner: Some(owner.into()),
        context_id: "ctx".into(),
        direction,
        peer: None,
        state: TaskState::Working,
        message: Message { role: Role::User, parts: Vec::new(), message_id: None },
        priority: 3,
        response_expected: true,
        sender_task_id: (direction == Direction::Incoming).then(|| sender_task.clone()),
        in_reply_to: None,
        peer_task_id: (direction == Direction::Outgoing).then(|| receiver_task.clone()),
        message_in: Some(receiver_task.clone()),
    };
    let send = vec![
        created(&sender_task, AGENTS[0], Direction::Outgoing),
        created(&receiver_task, AGENTS[1], Direction::Incoming),
        Event::MessageSent {
            task_id: receiver_task.clone(),
            from: Some(AGENTS[0].into()),
            to: AGENTS[1].into(),
            priority: 3,
            response_expected: true,
            sender_task_id: Some(sender_task.clone()),
            in_reply_to: None,
            text: text.into(),
            parts: Vec::new(),
            by_user: false,
            unverified_sender: None,
            sender_endpoint: None,
            external_task_id: None,
            idempotency_key: None,
        },
    ];
    let completed = |task_id: &str| Event::TaskStateChanged {
        task_id: task_id.into(),
        state: TaskState::Completed,
        artifacts: Vec::new(),
        error: None,
        reply_of: Some(receiver_task.clone()),
        as_message: false,
    };
    let answer = vec![
        Event::ReplyPosted {
            task_id: receiver_task.clone(),
            sender_task_id: Some(sender_task.clone()),
            from: AGENTS[1].into(),
            to: Some(AGENTS[0].into()),
            text: reply.into(),
            idempotency_key: None,
        },
        completed(&sender_task),
        completed(&receiver_task),
    ];
    (send, answer)
}

/// Rows refer to a long text: none of them holds it.
fn assert_no_task_row_holds_a_long_text(store: &Store) {
    let txn = store.db().unwrap().begin_read().unwrap();
    let tasks = txn.open_table(LIVE.tasks).unwrap();
    for row in tasks.iter().unwrap() {
        let (_, value) = row.unwrap();
        assert!(value.value().len() < 1_000, "a task row holds {} bytes", value.value().len());
    }
}

#[test]
fn a_long_message_and_its_reply_are_stored_once_and_read_back_whole() {
    let text = "long ".repeat(100_000);
    let reply = "answer ".repeat(50_000);
    let store = memory_store();
    let (send, answer) = long_exchange(&text, &reply);
    let written = store.transact(1_000, |appender| appender.append(None, send)).unwrap();
    store.transact(2_000, |appender| appender.append(None, answer)).unwrap();

    assert_no_task_row_holds_a_long_text(&store);

    // Every read gives the whole text, as if it had been copied.
    for task_id in [TASKS[0], TASKS[1]] {
        let task = store.read(|view| view.task(task_id)).unwrap().unwrap();
        assert_eq!(task.message, Message::text(Role::User, text.clone()));
        assert_eq!(task.artifacts, vec![Artifact::text(reply.clone())]);
        assert_eq!(task.state, TaskState::Completed);
    }
    // Readers of the log and the writer's own answer see the events in their inline shape.
    let events = store.read_after(0, 100).unwrap();
    for envelope in events.iter().chain(&written) {
        match &envelope.event {
            Event::TaskCreated { message, message_in, .. } => {
                assert_eq!(message, &Message::text(Role::User, text.clone()));
                assert_eq!(message_in, &None);
            }
            Event::TaskStateChanged { artifacts, reply_of, .. } => {
                assert_eq!(artifacts, &vec![Artifact::text(reply.clone())]);
                assert_eq!(reply_of, &None);
            }
            _ => {}
        }
    }
    assert_eq!(store.verify().unwrap().differences, Vec::<String>::new());
    store.rebuild().unwrap();
    let task = store.read(|view| view.task(TASKS[0])).unwrap().unwrap();
    assert_eq!(task.artifacts, vec![Artifact::text(reply)]);
    store.index_history().unwrap();
    let found = store.search_history(&["answer".to_string()], history::Logic::Or, false, None, 10).unwrap();
    assert_eq!(found.len(), 2, "both sides of the exchange are found by the reply's words");
}

/// Within one transaction (the writer's batch) every read sees the writes before it: the rows
/// the projections keep decoded for the batch follow each change, removal and new row.
#[test]
fn reads_in_a_transaction_see_its_own_writes() {
    let store = memory_store();
    let agent_id = AGENTS[0];
    let task_id = TASKS[0];
    let registered = Event::AgentRegistered {
        agent_type: "dummy".into(),
        agent_id: agent_id.into(),
        name: None,
        role: None,
        pid: 7,
        port: 8190,
        working_dir: "/tmp".into(),
        secret_hash: "00".into(),
        pid_start: None,
        wrapper: true,
        resumes: false,
    };
    let status = |status| Event::AgentStatusChanged { agent_id: agent_id.into(), status, note: None };
    let state = |state| Event::TaskStateChanged {
        task_id: task_id.into(),
        state,
        artifacts: Vec::new(),
        error: None,
        reply_of: None,
        as_message: false,
    };
    store
        .transact(1_000, |appender| {
            assert!(appender.view().agent(agent_id)?.is_none());
            appender.append(None, vec![registered.clone()])?;
            assert_eq!(appender.view().agent(agent_id)?.map(|agent| agent.status), Some(AgentStatus::Starting));
            appender.append(None, vec![status(AgentStatus::Ready)])?;
            assert_eq!(appender.view().agent(agent_id)?.map(|agent| agent.status), Some(AgentStatus::Ready));
            appender
                .append(None, vec![Event::AgentDeregistered { agent_id: agent_id.into(), reason: "gone".into() }])?;
            assert!(appender.view().agent(agent_id)?.is_none());
            appender.append(None, vec![registered.clone()])?;
            assert!(appender.view().agent(agent_id)?.is_some(), "registered again");

            assert!(appender.view().task(task_id)?.is_none());
            appender.append(None, vec![alice_asks_bob(task_id, "hello")])?;
            assert_eq!(appender.view().task(task_id)?.map(|task| task.state), Some(TaskState::Submitted));
            appender.append(None, vec![state(TaskState::Working)])?;
            assert_eq!(appender.view().task(task_id)?.map(|task| task.state), Some(TaskState::Working));
            appender.append(None, vec![state(TaskState::Completed)])?;
            assert_eq!(appender.view().task(task_id)?.map(|task| task.state), Some(TaskState::Completed));
            Ok(())
        })
        .unwrap();
    // And what the transaction stored is what it read last.
    let (agent, task) = store.read(|view| Ok((view.agent(agent_id)?, view.task(task_id)?))).unwrap();
    assert_eq!(agent.map(|agent| agent.status), Some(AgentStatus::Starting));
    assert_eq!(task.map(|task| task.state), Some(TaskState::Completed));
    // A later transaction reads the committed rows, and its own changes to them.
    store
        .transact(2_000, |appender| {
            assert_eq!(appender.view().agent(agent_id)?.map(|agent| agent.status), Some(AgentStatus::Starting));
            appender.append(None, vec![status(AgentStatus::Processing)])?;
            assert_eq!(appender.view().agent(agent_id)?.map(|agent| agent.status), Some(AgentStatus::Processing));
            appender.append(None, vec![Event::TaskCanceled { task_id: task_id.into(), reason: None, by: None }])?;
            assert_eq!(appender.view().task(task_id)?.map(|task| task.state), Some(TaskState::Canceled));
            Ok(())
        })
        .unwrap();
    assert!(store.verify().unwrap().differences.is_empty());
}

/// A long exchange in one transaction: the rows the transaction keeps decoded stay rows (a
/// read fills the texts into a copy), and the reply's event finds the replier's task there.
#[test]
fn a_long_exchange_in_one_transaction_reads_back_whole_and_stores_rows_without_the_text() {
    let text = "long ".repeat(10_000);
    let reply = "answer ".repeat(5_000);
    let store = memory_store();
    let (send, answer) = long_exchange(&text, &reply);
    store
        .transact(1_000, |appender| {
            appender.append(None, send)?;
            for _ in 0..2 {
                let task = appender.view().task(TASKS[1])?.expect("the receiver's task");
                assert_eq!(task.message, Message::text(Role::User, text.clone()));
            }
            appender.append(None, answer)?;
            for task_id in [TASKS[0], TASKS[1]] {
                for _ in 0..2 {
                    let task = appender.view().task(task_id)?.expect("task");
                    assert_eq!(task.artifacts, vec![Artifact::text(reply.clone())], "{task_id}");
                    assert_eq!(task.state, TaskState::Completed);
                }
            }
            Ok(())
        })
        .unwrap();
    assert_no_task_row_holds_a_long_text(&store);
    assert_eq!(store.verify().unwrap().differences, Vec::<String>::new());
}

/// A crash between two durable commits: the database file as it was at the last durable one,
/// and the write-ahead log holding the batches after it.
#[test]
fn after_a_crash_the_batches_only_the_write_ahead_log_held_are_stored_and_applied_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let store = Store::open(&path).unwrap();
    let status = |agent: &str| {
        vec![Event::AgentStatusChanged { agent_id: agent.into(), status: AgentStatus::Ready, note: None }]
    };
    store.transact(1, |appender| appender.append(None, status(AGENTS[0]))).unwrap();
    store.checkpoint().unwrap();

    // Acknowledged batches that only the log holds: a send, its reply, one more.
    let (send, answer) = long_exchange("a message", "its reply");
    store.transact(2, |appender| appender.append(Some(AGENTS[0]), send)).unwrap();
    store.transact(3, |appender| appender.append(Some(AGENTS[1]), answer)).unwrap();
    store.transact(4, |appender| appender.append(None, status(AGENTS[1]))).unwrap();
    assert!(store.checkpoint_pending());
    // What a SIGKILL leaves: the database file with the pages the non-durable commits wrote but
    // its header at the last durable commit, and the log.
    let image = std::fs::read(&path).unwrap();
    let logged = std::fs::read(dir.path().join("log.wal")).unwrap();
    let head = store.head().unwrap();
    let events = store.read_after(0, 100).unwrap();
    let task = store.read(|projections| projections.task(TASKS[1])).unwrap();
    assert!(task.is_some());
    drop(store);

    let crashed = tempfile::tempdir().unwrap();
    std::fs::write(crashed.path().join("log.redb"), image).unwrap();
    std::fs::write(crashed.path().join("log.wal"), logged).unwrap();
    let store = Store::open(&crashed.path().join("log.redb")).unwrap();
    assert_eq!(store.head().unwrap(), head);
    assert_eq!(store.read_after(0, 100).unwrap(), events, "the same events, with their times and actors");
    assert_eq!(store.read(|projections| projections.task(TASKS[1])).unwrap(), task);
    assert!(store.verify().unwrap().differences.is_empty());
    drop(store);

    // A log that does not continue the database is refused, not half applied.
    let alone = tempfile::tempdir().unwrap();
    let mut gap = Vec::new();
    wal::push_event(
        &mut gap,
        7,
        &Envelope {
            v: crate::event::SCHEMA_VERSION,
            seq: 7,
            time_ms: 1,
            actor: None,
            event: status(AGENTS[0]).remove(0),
        }
        .encode(),
    );
    {
        let mut log = wal::Wal::open(&alone.path().join("log.wal"), 7, None).unwrap();
        log.append(&gap).unwrap();
    }
    let error = Store::open(&alone.path().join("log.redb")).map(|_| ()).unwrap_err();
    assert!(error.to_string().contains("write-ahead log"), "{error}");
}

/// The write-ahead log's salt is the database's, kept from its first open: after a crash it
/// finds the log's records even when the first one is damaged (no salt to read there), and the
/// open is refused rather than the acknowledged batches after it dropped without a word.
#[test]
fn a_crashed_log_whose_first_record_is_damaged_is_refused_by_the_databases_salt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let status = |agent: &str| {
        vec![Event::AgentStatusChanged { agent_id: agent.into(), status: AgentStatus::Ready, note: None }]
    };
    // Opened and closed once first: the salt is the one the database kept, not one made anew.
    drop(Store::open(&path).unwrap());
    let store = Store::open(&path).unwrap();
    store.transact(1, |appender| appender.append(None, status(AGENTS[0]))).unwrap();
    store.checkpoint().unwrap();
    store.transact(2, |appender| appender.append(None, status(AGENTS[1]))).unwrap();
    store.transact(3, |appender| appender.append(None, status(AGENTS[0]))).unwrap();
    let image = std::fs::read(&path).unwrap();
    let mut logged = std::fs::read(dir.path().join("log.wal")).unwrap();
    drop(store);
    logged[1] ^= 0x08;
    let crashed = tempfile::tempdir().unwrap();
    std::fs::write(crashed.path().join("log.redb"), &image).unwrap();
    std::fs::write(crashed.path().join("log.wal"), &logged).unwrap();
    let error = Store::open(&crashed.path().join("log.redb")).map(|_| ()).unwrap_err();
    assert!(error.to_string().contains("truncate -s 0 "), "{error}");
    // Cut as the advice says, it opens with the events the database has.
    std::fs::write(crashed.path().join("log.wal"), b"").unwrap();
    let store = Store::open(&crashed.path().join("log.redb")).unwrap();
    assert_eq!(store.head().unwrap(), 1);
}

/// An event of the write-ahead log must decode, and be the event its record numbers: one
/// numbered otherwise was stored under the record's number (two events 1 in `synapse events`,
/// none 2), and a refusal to decode named neither the log nor the event.
#[test]
fn a_logged_event_that_is_not_the_one_its_record_numbers_is_refused() {
    let envelope = |seq: u64| {
        let event = Event::AgentStatusChanged { agent_id: AGENTS[0].into(), status: AgentStatus::Ready, note: None };
        Envelope { v: crate::event::SCHEMA_VERSION, seq, time_ms: 1, actor: None, event }.encode()
    };
    for (what, payload_of, said) in [
        ("numbered otherwise", envelope(2), "holds event 2 where event 1 should be"),
        ("undecodable", b"\x93\x01".to_vec(), "event 1 of the write-ahead log cannot be read"),
    ] {
        let alone = tempfile::tempdir().unwrap();
        let mut payload = Vec::new();
        wal::push_event(&mut payload, 1, &payload_of);
        {
            let mut log = wal::Wal::open(&alone.path().join("log.wal"), 7, None).unwrap();
            log.append(&payload).unwrap();
        }
        let error = Store::open(&alone.path().join("log.redb")).map(|_| ()).unwrap_err();
        assert!(error.to_string().contains(said), "{what}: {error}");
    }
}

/// A history index step that reaches the head is committed without an fsync and made durable
/// by the next checkpoint; a crash before that takes the step back whole (segments and
/// watermark), and the indexer takes it again.
#[test]
fn an_index_step_that_reaches_the_head_waits_for_the_checkpoint_and_a_crash_takes_it_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let store = Store::open(&path).unwrap();
    for (n, task) in TASKS.iter().take(3).enumerate() {
        let event = alice_asks_bob(task, &format!("parser number{n}"));
        store.transact(1_000 + n as u64, |appender| appender.append(None, vec![event])).unwrap();
    }
    store.checkpoint().unwrap();
    assert!(!store.checkpoint_pending());
    // A step of a catch-up (the head is further on) is durable at once.
    assert_eq!(store.index_history_step(1).unwrap().indexed_through, 1);
    assert!(!store.checkpoint_pending(), "a catch-up step is durable");
    // The step that reaches the head waits for the next checkpoint.
    assert_eq!(store.index_history_step(100).unwrap().indexed_through, 3);
    assert!(store.checkpoint_pending(), "the last step is not durable yet");

    // What a SIGKILL leaves now: the database file as at its last durable commit.
    let image = std::fs::read(&path).unwrap();
    let logged = std::fs::read(dir.path().join("log.wal")).unwrap();
    let search = |store: &Store| {
        let keywords = ["parser".to_string(), "number2".to_string()];
        let scanned = store.read(|view| view.search_history(&keywords, history::Logic::Or, false, None, 10)).unwrap();
        let indexed = store.search_history(&keywords, history::Logic::Or, false, None, 10).unwrap();
        assert_eq!(indexed, scanned);
        indexed.len()
    };
    assert_eq!(search(&store), 3, "the three messages alice sent");
    let crashed = tempfile::tempdir().unwrap();
    std::fs::write(crashed.path().join("log.redb"), image).unwrap();
    std::fs::write(crashed.path().join("log.wal"), logged).unwrap();
    {
        let after_crash = Store::open(&crashed.path().join("log.redb")).unwrap();
        assert_eq!(after_crash.index_progress().unwrap().indexed_through, 1, "the last step is taken back");
        assert_eq!(search(&after_crash), 3);
        assert_eq!(after_crash.index_history_step(100).unwrap().indexed_through, 3, "and taken again");
        assert_eq!(search(&after_crash), 3);
    }

    store.checkpoint().unwrap();
    assert!(!store.checkpoint_pending());
    let image = std::fs::read(&path).unwrap();
    let checkpointed = tempfile::tempdir().unwrap();
    std::fs::write(checkpointed.path().join("log.redb"), image).unwrap();
    let after_checkpoint = Store::open(&checkpointed.path().join("log.redb")).unwrap();
    assert_eq!(after_checkpoint.index_progress().unwrap().indexed_through, 3, "durable after the checkpoint");
}

#[test]
fn a_read_cut_off_by_a_reopen_says_why_the_store_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("log.redb")).unwrap();
    store.transact(1, |appender| appender.append(None, small_batch())).unwrap();
    store.checkpoint().unwrap();
    let cut_off = store
        .reading(|txn| {
            // The reopen closes the database this transaction reads; redb then answers
            // "closed" to its reads.
            store.reopen("the disk is full (a test)").unwrap();
            Ok(txn.open_table(LOG)?.last()?.map(|(seq, _)| seq.value()))
        })
        .unwrap_err();
    assert!(matches!(cut_off, StoreError::Reopening(Some(_))), "{cut_off:?}");
    assert!(cut_off.to_string().contains("the disk is full (a test)"), "{cut_off}");
    assert_eq!(store.head().unwrap(), 1, "the reopened store reads again");
}

#[test]
fn a_prefix_lookup_filters_before_it_reads_texts_and_stops_at_its_read_limit() {
    let store = memory_store();
    let mut events = Vec::new();
    for n in 0..40u64 {
        let mut event = alice_asks_bob(&format!("ab{n:02}"), &format!("question {n}"));
        // Every fourth task is carol's.
        if let Event::TaskCreated { owner, .. } = &mut event
            && n % 4 == 0
        {
            *owner = Some("carol".into());
        }
        events.push(event);
    }
    events.push(alice_asks_bob("ac00", "another prefix"));
    store.transact(1_000, |appender| appender.append(None, events)).unwrap();
    let carols = |task: &TaskRecord| task.owner.as_deref() == Some("carol");

    let found = store.read(|view| view.tasks_with_prefix_where("ab", carols, 100, 1_000)).unwrap().unwrap();
    let ids: Vec<&str> = found.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(ids, ["ab00", "ab04", "ab08", "ab12", "ab16", "ab20", "ab24", "ab28", "ab32", "ab36"]);
    assert_eq!(found[1].message, Message::text(Role::User, "question 4"), "the texts of the tasks kept are read");
    // At most `limit` kept.
    let two = store.read(|view| view.tasks_with_prefix_where("ab", carols, 2, 1_000)).unwrap().unwrap();
    assert_eq!(two.len(), 2);
    // 40 tasks start with "ab": a read limit of 40 reads them all, 39 refuses.
    assert!(store.read(|view| view.tasks_with_prefix_where("ab", carols, 100, 40)).unwrap().is_some());
    assert!(store.read(|view| view.tasks_with_prefix_where("ab", carols, 100, 39)).unwrap().is_none());
    // The limit counts the tasks that start with the prefix, not those after it.
    let one = store.read(|view| view.tasks_with_prefix_where("ac", |_| true, 100, 1)).unwrap().unwrap();
    assert_eq!(one.len(), 1);
}

/// Alice's task for a question to bob, in conversation `context`.
fn asked_in(task_id: &str, context: &str) -> Event {
    let mut event = alice_asks_bob(task_id, "hello");
    if let Event::TaskCreated { context_id, .. } = &mut event {
        *context_id = context.into();
    }
    event
}

/// An index another build has written to (one without conversation words: older than them, or
/// an older build opened on this file after a newer one) is emptied when the store opens, and
/// indexed again: `history thread` then finds the conversation from the index.
#[test]
fn an_index_another_build_wrote_to_is_indexed_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("synapse.redb");
    let events = vec![asked_in("aa000000", "one"), asked_in("bb000000", "one"), asked_in("cc000000", "two")];
    Store::open(&path).unwrap().transact(1_000, |appender| appender.append(None, events)).unwrap();
    let older_build = |txn: &redb::WriteTransaction| {
        // Written before the key existed.
        txn.open_table(search_index::INDEX_META)
            .unwrap()
            .remove(search_index::INDEXED_THROUGH_BY_THIS_VERSION)
            .unwrap();
    };
    let older_build_after_this_one = |txn: &redb::WriteTransaction| {
        // An older build's step moves the watermark alone.
        txn.open_table(search_index::INDEX_META).unwrap().insert("indexed_through", 2).unwrap();
    };
    for (case, other_build) in [("older", &older_build as &dyn Fn(&_)), ("older after", &older_build_after_this_one)] {
        {
            let store = Store::open(&path).unwrap();
            assert!(store.index_history().unwrap().caught_up());
            let txn = store.db().unwrap().begin_write().unwrap();
            other_build(&txn);
            txn.commit().unwrap();
        }
        let store = Store::open(&path).unwrap();
        let progress = store.index_progress().unwrap();
        assert_eq!((progress.indexed_through, progress.segments), (0, 0), "{case}: emptied");
        assert!(store.index_history().unwrap().caught_up());
        let thread = store.thread_of("bb").unwrap().unwrap();
        let tasks: Vec<&str> = thread.iter().map(|record| record.task_id.as_str()).collect();
        assert_eq!(tasks, ["aa000000", "bb000000"], "{case}");
        // This build opening it again keeps its index.
        drop(store);
        assert!(Store::open(&path).unwrap().index_progress().unwrap().caught_up(), "{case}: kept");
    }
}

/// A cleanup's cut-off hides a conversation's older tasks from `history thread` as from the
/// other views, indexed or not: a task it pruned is not found, as `history show` answers.
#[test]
fn thread_leaves_out_the_tasks_a_cleanup_pruned() {
    let store = memory_store();
    store.transact(1_000, |appender| appender.append(None, vec![asked_in("aa000000", "one")])).unwrap();
    let later = vec![asked_in("bb000000", "one"), asked_in("ab000000", "one")];
    store.transact(2_000, |appender| appender.append(None, later)).unwrap();
    let prune = vec![Event::HistoryPruned { before_ms: 1_500, max_size_mb: None }];
    store.transact(3_000, |appender| appender.append(None, prune)).unwrap();
    for indexed in [false, true] {
        if indexed {
            assert!(store.index_history().unwrap().caught_up());
        }
        for (prefix, expected) in
            [("bb", Some(vec!["ab000000", "bb000000"])), ("aa", None), ("a", Some(vec!["ab000000", "bb000000"]))]
        {
            let tasks = |thread: Option<Vec<history::HistoryRecord>>| {
                thread.map(|records| records.into_iter().map(|record| record.task_id).collect::<Vec<_>>())
            };
            let scanned = tasks(store.read(|view| view.thread_of(prefix)).unwrap());
            let from_index = tasks(store.thread_of(prefix).unwrap());
            let expected = expected.map(|ids| ids.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(scanned, expected, "{prefix}, indexed: {indexed}");
            assert_eq!(from_index, expected, "{prefix}, indexed: {indexed}");
        }
        assert!(store.read(|view| view.history_of_task("aa")).unwrap().is_empty(), "show finds it no more either");
    }
}

/// Conversations share the index's words for them (4,096 in all): `history thread` keeps the
/// tasks of its own conversation only, indexed or not yet.
#[test]
fn thread_keeps_its_own_conversation_among_those_sharing_its_word() {
    let contexts: Vec<String> = (0..).map(|n| format!("conversation-{n}")).take(5_000).collect();
    let (first, second) = contexts
        .iter()
        .enumerate()
        .find_map(|(i, one)| {
            let word = search_index::context_word(one);
            contexts[i + 1..].iter().find(|other| search_index::context_word(other) == word).map(|other| (one, other))
        })
        .expect("5,000 contexts over 4,096 words share one");
    let store = memory_store();
    let events = vec![asked_in("aa000000", first), asked_in("bb000000", second), asked_in("cc000000", first)];
    store.transact(1_000, |appender| appender.append(None, events)).unwrap();
    let thread = |store: &Store, task: &str| -> Vec<String> {
        store.thread_of(task).unwrap().unwrap().into_iter().map(|record| record.task_id).collect()
    };
    for indexed in [false, true] {
        if indexed {
            assert!(store.index_history().unwrap().caught_up());
        }
        assert_eq!(thread(&store, "aa"), ["aa000000", "cc000000"], "indexed: {indexed}");
        assert_eq!(thread(&store, "bb"), ["bb000000"], "indexed: {indexed}");
    }
}

#[test]
fn a_worker_snapshot_is_kept_across_a_reopen_and_a_rebuild_and_replaced_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let store = Store::open(&path).unwrap();
    assert_eq!(store.snapshot("delivery").unwrap(), None);
    let status = vec![Event::AgentStatusChanged { agent_id: AGENTS[0].into(), status: AgentStatus::Ready, note: None }];
    store.transact(1, |appender| appender.append(None, status)).unwrap();
    store.save_snapshot("delivery", b"first").unwrap();
    store.save_snapshot("delivery", b"second").unwrap();
    store.save_snapshot("other", b"its own").unwrap();
    assert_eq!(store.snapshot("delivery").unwrap().as_deref(), Some(&b"second"[..]));
    drop(store);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.snapshot("delivery").unwrap().as_deref(), Some(&b"second"[..]));
    assert_eq!(store.snapshot("other").unwrap().as_deref(), Some(&b"its own"[..]));
    store.rebuild().unwrap();
    assert_eq!(store.snapshot("delivery").unwrap().as_deref(), Some(&b"second"[..]));
    assert_eq!(store.head().unwrap(), 1, "the log is untouched");
}

/// The delivery worker's snapshot is saved outside the writer: on a full disk its commit fails
/// as the writer's would (an I/O failure, for which the worker asks the writer to reopen the
/// database). The reopened database keeps the batches acknowledged before and the previous
/// snapshot; with space again the next snapshot is saved.
#[test]
fn a_snapshot_that_a_full_disk_refuses_leaves_the_previous_one_and_every_acknowledged_batch() {
    let (_dir, switch, store) = store_on_a_disk_that_fills();
    store.transact(1, |appender| appender.append(None, small_batch())).unwrap();
    store.save_snapshot("delivery", b"first").unwrap();
    store.transact(2, |appender| appender.append(None, small_batch())).unwrap();
    assert!(store.checkpoint_pending(), "the second batch is durable in the write-ahead log only");

    std::fs::write(&switch, b"").unwrap();
    let error = store.save_snapshot("delivery", &vec![7_u8; 8 << 20]).unwrap_err();
    assert!(error.is_io_failure(), "{error:?}");
    assert!(matches!(error, StoreError::DiskFull(_)), "{error:?}");
    if let Err(reopen_error) = store.reopen(&error.to_string()) {
        assert!(reopen_error.is_io_failure(), "{reopen_error}");
        std::fs::remove_file(&switch).unwrap();
        store.reopen("a test").unwrap();
    } else {
        std::fs::remove_file(&switch).unwrap();
    }
    assert_eq!(store.head().unwrap(), 2, "both acknowledged batches are there");
    assert_eq!(store.snapshot("delivery").unwrap().as_deref(), Some(&b"first"[..]));
    store.save_snapshot("delivery", &vec![7_u8; 8 << 20]).unwrap();
    assert_eq!(store.snapshot("delivery").unwrap().map(|bytes| bytes.len()), Some(8 << 20));
    store.transact(3, |appender| appender.append(None, small_batch())).unwrap();
    assert_eq!(store.head().unwrap(), 3);
    assert!(store.verify().unwrap().differences.is_empty());
}

#[test]
fn a_batch_answered_not_stored_is_not_stored_when_a_checkpoint_fails_after_reaching_the_disk() {
    let (_dir, _switch, store) = store_on_a_disk_that_fills();
    let disk = store.source.as_ref().and_then(|source| source.simulated_disk.clone()).unwrap();
    store.transact(1, |appender| appender.append(None, small_batch())).unwrap();
    // The next durable commit reaches the disk, but its fsync reports a failure: redb then
    // answers that it failed, though a reopen finds it.
    disk.fail_sync_after_next_commit();
    let mut stored = 1;
    let mut failure = None;
    // A batch past the checkpoint's size, then small ones until one meets the failed fsync.
    for time in 2..10 {
        let batch = if time == 2 { large_batch() } else { small_batch() };
        match store.transact(time, |appender| appender.append(None, batch)) {
            Ok(_) => stored += 1,
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    let error = failure.expect("a checkpoint was due within a few batches");
    assert!(error.is_io_failure(), "{error:?}");
    store.reopen(&error.to_string()).unwrap();
    assert_eq!(store.head().unwrap(), stored, "every batch answered stored is there, and none answered not stored");
    store.transact(10, |appender| appender.append(None, small_batch())).unwrap();
    assert_eq!(store.head().unwrap(), stored + 1);
    assert!(store.verify().unwrap().differences.is_empty());
}

/// Is `dir` on tmpfs?
#[allow(unsafe_code)]
fn in_memory_file_system(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: statfs fills the struct on success; it is read only then.
    let stats = unsafe {
        assert_eq!(libc::statfs(path.as_ptr(), stats.as_mut_ptr()), 0);
        stats.assume_init()
    };
    stats.f_type == libc::TMPFS_MAGIC
}

/// How many of the file's pages the system's page cache holds (`mincore` on a mapping of it).
#[allow(unsafe_code)]
fn cached_pages(path: &std::path::Path) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let length = usize::try_from(file.metadata().unwrap().len()).unwrap();
    let page = 4096;
    let pages = length.div_ceil(page);
    let mut resident = vec![0_u8; pages];
    // SAFETY: a private read-only mapping of an open file, unmapped before returning; mincore
    // writes one byte per page into a vector of that many bytes.
    unsafe {
        let map = libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED);
        assert_eq!(libc::mincore(map, length, resident.as_mut_ptr()), 0);
        libc::munmap(map, length);
    }
    (resident.iter().filter(|byte| **byte & 1 == 1).count(), pages)
}

#[test]
fn a_reopen_first_drops_the_cached_pages_so_that_it_reads_what_the_disk_holds() {
    let dir = tempfile::tempdir().unwrap();
    if in_memory_file_system(dir.path()) {
        // tmpfs: its pages are the files themselves, never dropped (nor written to a disk).
        eprintln!("SKIPPED: the temporary directory is on tmpfs");
        return;
    }
    let path = dir.path().join("log.redb");
    let store = Store::open(&path).unwrap();
    for time in 1..20 {
        store.transact(time, |appender| appender.append(None, small_batch())).unwrap();
    }
    store.transact(20, |appender| appender.append(None, large_batch())).unwrap();
    store.checkpoint().unwrap();
    // Written and fsynced through the page cache, which still holds the pages.
    let (before, pages) = cached_pages(&path);
    assert!(before >= (8 << 20) / 4096, "{before} of {pages} pages cached after writing");
    // What `Store::reopen` does before it opens the file again.
    super::forget_cached_pages(&path);
    let (after, _) = cached_pages(&path);
    assert!(after < before / 10, "{after} of {pages} pages still cached ({before} before)");
}
