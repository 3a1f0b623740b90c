// Synapse dashboard. Everything shown comes from the broker's own API and its event log
// (/events as SSE, resumed after a reconnect); every text is set with textContent, never parsed
// as HTML: message text is untrusted. No library, no build step.
'use strict';

(() => {
  const RECENT_EVENTS = 2000; // events read at start to fill the message list
  const EVENTS_PAGE = 100; // rows of one page of the event log
  const ROW_HEIGHT = 52; // px, the message list's fixed row height (virtualised)
  const MAX_MESSAGES = 50000; // messages kept in the page
  const GONE = 'The broker does not answer'; // a request found nobody listening
  const EVENT_KINDS = [
    'agent_registered', 'agent_status_changed', 'agent_deregistered', 'task_created', 'message_sent',
    'ticket_issued', 'ticket_injected', 'reply_posted', 'reverse_ticket_issued', 'task_state_changed',
    'task_canceled', 'file_lock_acquired', 'file_lock_released', 'file_modified', 'history_pruned',
    'webhook_registered', 'webhook_removed', 'webhook_delivery_attempted', 'external_agent_added',
    'external_agent_removed', 'file_modifications_pruned', 'inbox_expired', 'idempotency_keys_expired',
    'task_continued', 'push_config_set', 'push_config_deleted', 'external_message_sent',
    'external_reply_received',
  ];
  const FINAL = new Set(['replied', 'completed', 'failed', 'canceled']);

  const $ = (id) => document.getElementById(id);
  // The API key, when auth is on and the page was opened without its page key (which passes
  // authentication by itself). Kept in this page's memory only, never in the browser's storage:
  // a page that later answers at this origin in this tab (another user's server on the port while
  // the broker is stopped) must find nothing there. A reload asks again.
  let apiKey = '';
  // The page key of this broker start, in the address `synapse dashboard` prints (`?key=`).
  // Kept nowhere else: a page loaded later in this tab (from a bookmark, say) does not get it.
  const keyInAddress = /^[0-9a-fA-F]{64}$/.exec(new URLSearchParams(location.search).get('key') || '');
  const pageKey = keyInAddress ? keyInAddress[0] : '';

  const state = {
    authEnabled: false,
    logStarted: null, // when the log followed began (its first event's time; 0: empty)
    lastSeq: 0, // the newest event applied: a repeated one (after a reconnect) is skipped
    agents: new Map(), // agent_id -> agent view
    messages: [], // oldest first
    messageById: new Map(), // receiver's and sender's task id -> message
    ticketTask: new Map(), // ticket number (its event's seq) -> task id
    locks: new Map(), // path -> lock
    filter: '',
    filtered: null, // messages matching the filter, newest first (null: recompute)
    eventsPage: null, // {oldest, newest} seqs of the event-log page shown; null = the newest page, live
    recentEvents: [], // the newest events, newest first, for the live page of the log
    openThread: null, // {taskId, owner}
  };

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function showError(message) {
    const box = $('error');
    if (!message) {
      box.hidden = true;
      box.textContent = '';
      return;
    }
    box.textContent = message;
    box.hidden = false;
  }

  function setConnection(label, dataState) {
    const badge = $('connection');
    badge.textContent = label;
    badge.dataset.state = dataState;
  }

  class ApiFailure extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(method, path, body) {
    const headers = {};
    const sentKey = apiKey;
    if (sentKey) headers['X-API-Key'] = sentKey;
    if (pageKey) headers['X-Synapse-Page-Key'] = pageKey;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let response;
    try {
      response = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (_) {
      forgetKey();
      throw new ApiFailure(0, `${GONE} (stopped?). Retrying…`);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const message = (data && (data.message || data.error)) || response.statusText || 'request failed';
      if (response.status === 401) askForKey(message, sentKey);
      throw new ApiFailure(response.status, `${response.status}: ${message}`);
    }
    return data;
  }

  // ---- the API key (auth on) ---------------------------------------------------------------

  let keyWaiters = [];
  // A 401 to a request that carried `sentKey`. One sent before a key was given (in flight while
  // the user typed it) refuses nothing: its caller waits for the key (given) and tries again.
  function askForKey(message, sentKey) {
    if (apiKey && apiKey !== sentKey) return;
    if (sentKey) {
      apiKey = '';
      showError(`Key refused: ${message}`);
    } else {
      showError('This broker requires an API key.');
    }
    $('key-form').hidden = false;
    $('key-input').focus();
  }
  // The broker went away: the key is not sent again to whatever answers at this origin next
  // (another user's server may take the port while the broker is stopped); the broker asks for
  // it again when it is back.
  function forgetKey() {
    apiKey = '';
  }
  // Resolves once a key is there to try (at once if one was given since the refused request).
  function keyGiven() {
    if (apiKey) return Promise.resolve();
    return new Promise((resolve) => keyWaiters.push(resolve));
  }
  $('key-form').addEventListener('submit', (event) => {
    event.preventDefault();
    apiKey = $('key-input').value.trim();
    if (!apiKey) return;
    $('key-input').value = '';
    $('key-form').hidden = true;
    showError('');
    const waiters = keyWaiters;
    keyWaiters = [];
    waiters.forEach((resolve) => resolve());
  });

  // ---- agents ------------------------------------------------------------------------------

  function agentLabel(id) {
    const agent = state.agents.get(id);
    return agent && agent.name ? `${agent.name} (${id})` : id || 'anonymous';
  }

  // Short form for the message rows: the agent's name when it has one.
  function shortLabel(id) {
    const agent = state.agents.get(id);
    return (agent && agent.name) || id || 'anonymous';
  }

  function duration(ms) {
    const seconds = Math.max(0, Math.floor(ms / 1000));
    if (seconds < 60) return `${seconds}s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
    return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
  }

  function renderAgents() {
    const container = $('agents');
    const cards = [];
    const sorted = [...state.agents.values()].sort((a, b) => a.agent_id.localeCompare(b.agent_id));
    for (const agent of sorted) {
      const card = element('div', 'card');
      card.dataset.agent = agent.agent_id;
      card.dataset.status = agent.status;
      card.append(element('div', 'name', agent.name || agent.agent_id));
      card.append(element('div', 'line', `${agent.agent_type} · ${agent.agent_id}`));
      const status = element('div', 'line');
      const label = element('span', 'status', agent.status);
      const since = element('span', 'since', '');
      since.dataset.since = String(agent.status_since_ms || 0);
      status.append(label, ' ', since);
      card.append(status);
      if (agent.status_note) card.append(element('div', 'line', agent.status_note));
      card.append(element('div', 'line queue', `queue ${agent.queue_depth || 0}`));
      const task = agent.current_task ? `task ${agent.current_task.id.slice(0, 8)}: ${agent.current_task.preview}` : 'no task';
      card.append(element('div', 'line task', task));
      cards.push(card);
    }
    container.replaceChildren(...cards);
    $('agent-count').textContent = `(${state.agents.size})`;
    updateDurations();
    renderTargets();
  }

  function updateDurations() {
    const now = Date.now();
    // A lock ends at its expiry without an event (the broker releases it when it next looks):
    // it leaves the list then.
    let expired = false;
    for (const [path, lock] of state.locks) {
      if (lock.expires_ms <= now) {
        state.locks.delete(path);
        expired = true;
      }
    }
    if (expired) renderLocks();
    for (const since of document.querySelectorAll('.card .since')) {
      const from = Number(since.dataset.since);
      since.textContent = from ? `for ${duration(now - from)}` : '';
    }
  }

  function renderTargets() {
    const select = $('send-to');
    const filter = $('message-filter');
    const chosen = select.value;
    const chosenFilter = filter.value;
    const ids = [...state.agents.keys()].sort();
    select.replaceChildren(...ids.map((id) => {
      const option = element('option', null, agentLabel(id));
      option.value = id;
      return option;
    }));
    if (ids.includes(chosen)) select.value = chosen;
    const all = element('option', null, 'all agents');
    all.value = '';
    filter.replaceChildren(all, ...ids.map((id) => {
      const option = element('option', null, agentLabel(id));
      option.value = id;
      return option;
    }));
    filter.value = ids.includes(chosenFilter) ? chosenFilter : '';
  }

  // Queue depth and current task are the broker's to count: refreshed from its snapshot, at
  // most once a second, when events say they may have changed.
  let refreshTimer = null;
  function scheduleAgentRefresh() {
    if (refreshTimer) return;
    refreshTimer = setTimeout(async () => {
      try {
        await loadAgents();
        // The broker answered, but a stream lost meanwhile (this request may have left
        // before it was) says so until the stream opens again, which clears it.
        const live = $('connection').dataset.state === 'live';
        if (live && isConnectionError($('error').textContent)) showError('');
      } catch (error) {
        showError(error.message);
      } finally {
        refreshTimer = null;
      }
    }, 1000);
  }

  async function loadAgents() {
    // The last event applied before asking: the stream may apply newer ones while the answer
    // (whose head was read when the request arrived) is on its way.
    const applied = state.lastSeq;
    const snapshot = await api('GET', '/dashboard/state');
    // Another log answers now (a fresh home's broker came up on this port): it started at
    // another time, or ends before the last event this page applied. Its events would be taken
    // for repeats and skipped (freezing the page), or mixed with the other log's: start again
    // from this log.
    const otherLog = state.logStarted !== null && state.logStarted !== 0 && snapshot.log_started_ms !== state.logStarted;
    if (otherLog || snapshot.head < applied) {
      startAgain();
      return null;
    }
    state.logStarted = snapshot.log_started_ms;
    state.authEnabled = snapshot.auth_enabled;
    // Without its key (or the API key) the page is not the user: it reads, and says so.
    $('read-only').textContent = pageKey
      ? 'Read-only: the broker has restarted since this page was opened. Open the address `synapse dashboard` prints now to send and cancel.'
      : 'Read-only: this page was opened without its key. Open the address `synapse dashboard` prints to send and cancel.';
    $('read-only').hidden = snapshot.as_user;
    $('send-form').querySelector('button').disabled = !snapshot.as_user;
    $('thread-cancel').disabled = !snapshot.as_user;
    state.agents = new Map(snapshot.agents.map((agent) => [agent.agent_id, agent]));
    renderAgents();
    return snapshot;
  }

  // ---- messages (virtualised list) --------------------------------------------------------

  function setMessageState(taskId, next) {
    const message = state.messageById.get(taskId);
    if (!message || FINAL.has(message.state)) return;
    if (next === 'written' && message.state !== 'queued') return;
    message.state = next;
    scheduleRender();
  }

  function addMessage(envelope) {
    const data = envelope.event.data;
    if (state.messageById.has(data.task_id)) return;
    const message = {
      id: data.task_id,
      senderTaskId: data.sender_task_id || null,
      from: data.from || (data.unverified_sender ? `${data.unverified_sender} (unverified)` : (data.by_user ? 'user' : 'anonymous')),
      to: data.to,
      priority: data.priority,
      response: Boolean(data.response_expected),
      text: typeof data.text === 'string' ? data.text : '',
      time: envelope.time_ms,
      state: 'queued',
    };
    state.messages.push(message);
    if (state.messages.length > MAX_MESSAGES) {
      // The oldest leave the page (history search and the event log still reach them).
      for (const old of state.messages.splice(0, state.messages.length - MAX_MESSAGES + MAX_MESSAGES / 10)) {
        // Only entries that still point to this message: a sender's task id is the client's
        // to give, and a newer message may have the same.
        for (const id of [old.id, old.senderTaskId]) {
          if (id && state.messageById.get(id) === old) state.messageById.delete(id);
        }
      }
    }
    state.messageById.set(data.task_id, message);
    if (data.sender_task_id) state.messageById.set(data.sender_task_id, message);
    state.filtered = null;
  }

  function visibleMessages() {
    if (!state.filtered) {
      const filter = state.filter;
      const list = [];
      for (let index = state.messages.length - 1; index >= 0; index -= 1) {
        const message = state.messages[index];
        if (!filter || message.from === filter || message.to === filter) list.push(message);
      }
      state.filtered = list;
    }
    return state.filtered;
  }

  const messageBox = $('messages');
  const spacer = element('div', 'spacer');
  messageBox.append(spacer);

  function renderMessages() {
    const list = visibleMessages();
    $('message-count').textContent = `(${list.length})`;
    spacer.style.height = `${list.length * ROW_HEIGHT}px`;
    const first = Math.max(0, Math.floor(messageBox.scrollTop / ROW_HEIGHT) - 5);
    const last = Math.min(list.length, first + Math.ceil((messageBox.clientHeight || 360) / ROW_HEIGHT) + 10);
    const rows = [];
    for (let index = first; index < last; index += 1) {
      const message = list[index];
      const row = element('div', 'msg');
      row.style.top = `${index * ROW_HEIGHT}px`;
      row.dataset.task = message.id;
      const route = element('div', 'route');
      const who = element('span', 'who', `${shortLabel(message.from)} → ${shortLabel(message.to)}`);
      who.title = `${message.from} → ${message.to}`;
      route.append(who);
      route.append(element('span', 'muted', `p${message.priority}${message.response ? ' :R' : ''}`));
      const stateBadge = element('span', 'state', message.state);
      stateBadge.dataset.state = message.state;
      route.append(stateBadge);
      route.append(element('span', 'muted', new Date(message.time).toLocaleTimeString()));
      row.append(route, element('div', 'text', message.text));
      rows.push(row);
    }
    spacer.replaceChildren(...rows);
  }

  let renderPending = false;
  function scheduleRender() {
    if (renderPending) return;
    renderPending = true;
    requestAnimationFrame(() => {
      renderPending = false;
      renderMessages();
      renderLocks();
      if (state.eventsPage === null) renderEventRows(state.recentEvents.slice(0, EVENTS_PAGE), true);
    });
  }

  messageBox.addEventListener('scroll', () => renderMessages());
  messageBox.addEventListener('click', (event) => {
    const row = event.target.closest('.msg');
    if (row) openThread(row.dataset.task);
  });
  $('message-filter').addEventListener('change', () => {
    state.filter = $('message-filter').value;
    state.filtered = null;
    messageBox.scrollTop = 0;
    renderMessages();
  });

  // ---- thread, cancel ----------------------------------------------------------------------

  function recordItem(record) {
    const item = element('li');
    const head = element('div', 'muted',
      `${record.side === 'sent' ? `${record.agent} → ${record.peer}` : `${record.peer} → ${record.agent}`} · ${record.status} · p${record.priority} · ${record.task_id.slice(0, 8)} · ${new Date(record.created_ms).toLocaleString()}`);
    item.append(head, element('div', 'input', record.input));
    if (record.output) item.append(element('div', 'output', `↳ ${record.output}`));
    return item;
  }

  async function openThread(taskId) {
    const message = state.messageById.get(taskId);
    state.openThread = { taskId, owner: message ? message.to : null };
    $('thread-section').hidden = false;
    $('thread-title').textContent = taskId.slice(0, 8);
    $('thread').replaceChildren(element('li', 'muted', 'loading…'));
    try {
      const answer = await api('GET', `/threads/${encodeURIComponent(taskId)}`);
      // Another thread opened (or the panel closed) while this one loaded: not shown.
      if (!state.openThread || state.openThread.taskId !== taskId) return;
      // Each exchange has two sides; the thread shows the receiver's.
      const records = answer.records.filter((record) => record.side === 'received' || answer.records.length === 1);
      $('thread').replaceChildren(...(records.length ? records : answer.records).map(recordItem));
    } catch (error) {
      if (!state.openThread || state.openThread.taskId !== taskId) return;
      $('thread').replaceChildren(element('li', 'muted', error.message));
    }
  }

  $('thread-close').addEventListener('click', () => {
    $('thread-section').hidden = true;
    state.openThread = null;
  });
  $('thread-cancel').addEventListener('click', async () => {
    const open = state.openThread;
    if (!open || !open.owner) return;
    try {
      const path = `/agents/${encodeURIComponent(open.owner)}/tasks/${encodeURIComponent(open.taskId)}/cancel`;
      await api('POST', path);
      showError('');
      openThread(open.taskId);
    } catch (error) {
      showError(`Cancel refused: ${error.message}`);
    }
  });

  // ---- send --------------------------------------------------------------------------------

  $('send-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const to = $('send-to').value;
    const text = $('send-text').value;
    if (!to || !text) return;
    const request = {
      to,
      text,
      priority: Number($('send-priority').value),
      response_expected: $('send-response').checked,
    };
    try {
      const sent = await api('POST', '/send', request);
      const id = (sent.task && sent.task.id) || '';
      $('send-result').textContent = `sent: task ${id.slice(0, 8)} (${(sent.task && sent.task.status) || 'ok'})`;
      $('send-text').value = '';
      showError('');
    } catch (error) {
      $('send-result').textContent = '';
      showError(`Send refused: ${error.message}`);
    }
  });

  // ---- history search ----------------------------------------------------------------------

  $('search-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const keywords = $('search-input').value.trim();
    if (!keywords) return;
    try {
      const answer = await api('GET', `/history/search?q=${encodeURIComponent(keywords)}&limit=100`);
      const items = answer.records.map(recordItem);
      $('search-results').replaceChildren(...(items.length ? items : [element('li', 'muted', 'nothing found')]));
    } catch (error) {
      $('search-results').replaceChildren(element('li', 'muted', error.message));
    }
  });

  // ---- file locks --------------------------------------------------------------------------

  function renderLocks() {
    const locks = [...state.locks.values()].sort((a, b) => a.path.localeCompare(b.path));
    if (!locks.length) {
      $('locks').replaceChildren(element('div', 'muted', 'no file is locked'));
      return;
    }
    const table = element('table');
    const head = element('tr');
    head.append(element('th', null, 'file'), element('th', null, 'held by'), element('th', null, 'expires'));
    table.append(head);
    for (const lock of locks) {
      const row = element('tr');
      row.append(element('td', null, lock.path), element('td', null, agentLabel(lock.agent_id)),
        element('td', null, new Date(lock.expires_ms).toLocaleTimeString()));
      table.append(row);
    }
    $('locks').replaceChildren(table);
  }

  async function loadLocks() {
    try {
      const answer = await api('GET', '/file-safety/locks');
      state.locks = new Map(answer.locks.filter((entry) => !entry.expired).map((entry) => [entry.lock.path, entry.lock]));
    } catch (_) {
      state.locks = new Map(); // file safety off: no locks to show
    }
  }

  // ---- the event log, paged ----------------------------------------------------------------

  function eventSummary(envelope) {
    const data = envelope.event.data || {};
    const parts = [];
    for (const name of ['agent_id', 'from', 'to', 'task_id', 'status', 'state', 'path', 'text']) {
      if (data[name] !== undefined && data[name] !== null) {
        const value = String(data[name]);
        parts.push(`${name}=${value.length > 80 ? `${value.slice(0, 80)}…` : value}`);
      }
    }
    return `${envelope.seq} ${new Date(envelope.time_ms).toLocaleTimeString()} ${envelope.event.kind} ${parts.join(' ')}`;
  }

  function renderEventRows(newestFirst, live) {
    $('events').replaceChildren(...newestFirst.map((envelope) => element('li', null, eventSummary(envelope))));
    const first = newestFirst.length ? newestFirst[newestFirst.length - 1].seq : 0;
    const last = newestFirst.length ? newestFirst[0].seq : 0;
    $('events-range').textContent = newestFirst.length ? `${first}–${last}${live ? ' (live)' : ''}` : 'empty';
  }

  // Shows the page a query of /dashboard/events answers (`before=N` or `after=N`); an empty
  // one changes nothing.
  async function showEventPage(query) {
    try {
      const answer = await api('GET', `/dashboard/events?${query}&limit=${EVENTS_PAGE}`);
      if (!answer.events.length) return;
      const newest = answer.events[answer.events.length - 1].seq;
      state.eventsPage = { oldest: answer.events[0].seq, newest };
      renderEventRows(answer.events.slice().reverse(), false);
    } catch (error) {
      showError(error.message);
    }
  }

  // The oldest event the live view shows (the next one to come when it shows none).
  function liveOldest() {
    const shown = Math.min(EVENTS_PAGE, state.recentEvents.length);
    return shown ? state.recentEvents[shown - 1].seq : state.lastSeq + 1;
  }

  function showLive() {
    state.eventsPage = null;
    renderEventRows(state.recentEvents.slice(0, EVENTS_PAGE), true);
  }

  $('events-newest').addEventListener('click', showLive);
  $('events-older').addEventListener('click', () => {
    const oldest = state.eventsPage !== null ? state.eventsPage.oldest : liveOldest();
    if (oldest > 1) showEventPage(`before=${oldest}`);
  });
  // A page holds fewer events when their texts are long: the next one starts where it ends,
  // and is the live view once that is where the live view begins (it too may hold fewer).
  $('events-newer').addEventListener('click', () => {
    if (state.eventsPage === null) return;
    if (state.eventsPage.newest + 1 >= liveOldest()) showLive();
    else showEventPage(`after=${state.eventsPage.newest}`);
  });

  // ---- applying events ---------------------------------------------------------------------

  // Applies one event to the page's state; `live` is false for the events read at start
  // (the agents then come from the snapshot, not from old events).
  function apply(envelope, live) {
    const data = envelope.event.data || {};
    switch (envelope.event.kind) {
      case 'agent_registered':
        if (live) {
          state.agents.set(data.agent_id, {
            agent_id: data.agent_id, agent_type: data.agent_type, name: data.name, role: data.role,
            port: data.port, status: 'STARTING', status_since_ms: envelope.time_ms, queue_depth: 0,
          });
          renderAgents();
          scheduleAgentRefresh();
        }
        break;
      case 'agent_status_changed': {
        const agent = state.agents.get(data.agent_id);
        if (live && agent) {
          agent.status = data.status;
          agent.status_note = data.note;
          agent.status_since_ms = envelope.time_ms;
          const card = document.querySelector(`.card[data-agent="${CSS.escape(data.agent_id)}"]`);
          if (card) {
            card.dataset.status = data.status;
            card.querySelector('.status').textContent = data.status;
            card.querySelector('.since').dataset.since = String(envelope.time_ms);
            updateDurations();
          }
          scheduleAgentRefresh();
        }
        break;
      }
      case 'agent_deregistered':
        if (live) {
          state.agents.delete(data.agent_id);
          renderAgents();
        }
        break;
      case 'message_sent':
        addMessage(envelope);
        if (live) scheduleAgentRefresh();
        break;
      case 'ticket_issued':
        state.ticketTask.set(envelope.seq, data.task_id);
        // Tickets that are never written (handed over by a hook, expired, their task canceled)
        // leave no event here: the oldest go once there are more than messages kept.
        while (state.ticketTask.size > MAX_MESSAGES) state.ticketTask.delete(state.ticketTask.keys().next().value);
        if (live) scheduleAgentRefresh();
        break;
      case 'ticket_injected': {
        const taskId = state.ticketTask.get(data.ticket);
        if (taskId) setMessageState(taskId, 'written');
        state.ticketTask.delete(data.ticket);
        if (live) scheduleAgentRefresh();
        break;
      }
      case 'reply_posted':
        setMessageState(data.task_id, 'replied');
        break;
      case 'task_state_changed':
        if (FINAL.has(data.state)) setMessageState(data.task_id, data.state);
        if (live) scheduleAgentRefresh();
        break;
      case 'task_canceled':
        setMessageState(data.task_id, 'canceled');
        if (live) scheduleAgentRefresh();
        break;
      case 'file_lock_acquired':
        // At start the locks come from /file-safety/locks; old events would only repeat them.
        if (live) state.locks.set(data.path, { path: data.path, agent_id: data.agent_id, expires_ms: data.expires_ms });
        break;
      case 'file_lock_released':
        if (live) state.locks.delete(data.path);
        break;
      default:
        break;
    }
    state.recentEvents.unshift(envelope);
    if (state.recentEvents.length > EVENTS_PAGE) state.recentEvents.length = EVENTS_PAGE;
    if (live) {
      if (state.openThread && (data.task_id === state.openThread.taskId || data.sender_task_id === state.openThread.taskId)) {
        openThread(state.openThread.taskId);
      }
      $('head').textContent = `event ${envelope.seq}`;
    }
    scheduleRender();
  }

  // ---- the live stream ---------------------------------------------------------------------

  let source = null;
  let retryDelay = 500;
  const LOST = 'Lost the connection to the broker';

  /** Does the error shown say only that the broker could not be reached? */
  function isConnectionError(text) {
    return text.startsWith(LOST) || text.startsWith(GONE);
  }

  function onStreamEvent(message) {
    const seq = Number(message.lastEventId);
    // After a reconnect the stream resumes after the last id it delivered; an event seen
    // already (from the first read or an earlier stream) is never applied twice.
    if (!Number.isFinite(seq) || seq <= state.lastSeq) return;
    let envelope;
    try {
      envelope = JSON.parse(message.data);
    } catch (_) {
      return;
    }
    state.lastSeq = seq;
    apply(envelope, true);
  }

  async function openStream() {
    if (starting) return;
    if (source) source.close();
    source = null;
    const opening = epoch;
    let token = null;
    try {
      if (state.authEnabled) token = (await api('POST', '/dashboard/stream-token')).token;
    } catch (error) {
      if (opening !== epoch) return;
      setConnection('broker gone', 'gone');
      showError(error.message);
      if (error.status === 401) await keyGiven();
      return retryLater();
    }
    // The page started again (another log) while the token was on its way: that start opens
    // its own stream.
    if (starting || opening !== epoch) return;
    let url = `/events?follow=true&after=${state.lastSeq}`;
    if (token !== null) url += `&token=${encodeURIComponent(token)}`;
    const stream = new EventSource(url);
    source = stream;
    for (const kind of EVENT_KINDS) stream.addEventListener(kind, onStreamEvent);
    stream.addEventListener('open', () => {
      retryDelay = 500;
      setConnection('live', 'live');
      // The broker answers again: what said it did not (the stream, or a refresh that ran
      // while it was away) is over.
      if (isConnectionError($('error').textContent)) showError('');
      scheduleAgentRefresh();
    });
    stream.addEventListener('error', (event) => {
      if (stream !== source) return;
      if (event instanceof MessageEvent) {
        // The broker's own `error` frame (it could not read its log), then the end of the
        // stream: a new stream from the last event applied, the key kept (the broker is there).
        stream.close();
        showError(`${LOST}: ${event.data}`);
        setConnection('reconnecting', 'reconnecting');
        retryLater();
        return;
      }
      // The connection was lost (the browser tries again): the broker went away. Not when it
      // answered with an error (a token the restarted broker does not know): it is back, and
      // a key given meanwhile is for it.
      if (stream.readyState === EventSource.CONNECTING) forgetKey();
      showError(`${LOST}: reconnecting… (the page resumes where it stopped)`);
      if (stream.readyState === EventSource.CLOSED) {
        // The browser gave up (the broker answered with an error: a spent token, a restart
        // that forgot it): open a new stream from the last event applied.
        setConnection('reconnecting', 'reconnecting');
        retryLater();
      } else {
        // The browser reconnects by itself and resumes with Last-Event-ID.
        setConnection('reconnecting', 'reconnecting');
      }
    });
  }

  function retryLater() {
    const delay = retryDelay;
    retryDelay = Math.min(retryDelay * 2, 5000);
    setTimeout(openStream, delay);
  }

  // Another log answers at this port: the page starts again from it, in place. Never by
  // navigating (a reload): what answers may be another user's server squatting the port while
  // the broker is stopped, whose own page would then run in this tab.
  function startAgain() {
    epoch += 1;
    if (source) source.close();
    source = null;
    Object.assign(state, {
      filter: '',
      logStarted: null,
      lastSeq: 0,
      agents: new Map(),
      messages: [],
      messageById: new Map(),
      ticketTask: new Map(),
      locks: new Map(),
      filtered: null,
      eventsPage: null,
      recentEvents: [],
      openThread: null,
    });
    $('thread-section').hidden = true;
    $('head').textContent = '';
    renderAgents();
    renderMessages();
    renderLocks();
    renderEventRows([], true);
    start();
  }

  // While (re)starting, the stream waits: opened meanwhile (a retry), it would read the log
  // from the event before the snapshot's. Each start has its epoch: a stream or a start of an
  // earlier one gives way.
  let starting = false;
  let epoch = 0;

  async function start() {
    starting = true;
    const mine = epoch;
    try {
      await load(mine);
    } catch (error) {
      // An answer that is not what the broker sends (another server at the port): tried again.
      if (mine !== epoch) return;
      showError(`The page could not start: ${error.message}. Retrying…`);
      await new Promise((resolve) => setTimeout(resolve, 2000));
      if (mine === epoch) start();
      return;
    }
    if (mine !== epoch) return;
    starting = false;
    openStream();
  }

  async function load(mine) {
    const superseded = () => mine !== epoch;
    let snapshot = null;
    while (!snapshot) {
      try {
        snapshot = await loadAgents();
      } catch (error) {
        if (error.status === 401) {
          await keyGiven();
        } else {
          setConnection('broker gone', 'gone');
          showError(error.message);
          await new Promise((resolve) => setTimeout(resolve, 2000));
        }
      }
      // Another log, found meanwhile: startAgain has begun a new start.
      if (superseded()) return;
    }
    const head = snapshot.head;
    const [recent] = await Promise.all([
      api('GET', `/dashboard/events?before=${head + 1}&limit=${RECENT_EVENTS}`).catch((error) => {
        showError(error.message);
        return { events: [] };
      }),
      loadLocks(),
    ]);
    if (superseded()) return;
    if (!recent || !Array.isArray(recent.events)) throw new Error('the broker answered what it never sends');
    for (const envelope of recent.events) apply(envelope, false);
    state.lastSeq = head;
    $('head').textContent = `event ${head}`;
    renderMessages();
    renderLocks();
    renderEventRows(state.recentEvents.slice(0, EVENTS_PAGE), true);
    // The first full render is laid out (reading a size forces style and layout): the mark
    // tools/bench's dashboard scenario reads (dashboard_first_render_ms).
    if (document.body.offsetHeight >= 0) performance.mark('synapse-first-render');
    document.body.dataset.ready = 'true';
  }

  setInterval(updateDurations, 1000);
  start();
})();
