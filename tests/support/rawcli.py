"""A raw-mode CLI with bracketed paste, like the real AI CLIs, for the injection tests.

Puts its terminal in raw mode, turns bracketed paste on, draws `rawcli> ` and reads keys. Enter
outside a paste submits the line; Ctrl-C, Ctrl-\\ and Ctrl-D outside a paste end the program (as
they end or interrupt a real CLI). Every submitted line and every such key is appended to the
log file (argv[1]) as one JSON line, so a test can see exactly what was submitted.

A submitted line containing `HANG-NOW` leaves it busy for good (no prompt again; control keys are
then only logged); one containing `ASK-NOW` shows a `(y/n)` question instead of the prompt. The first Enter after a
line containing `SWALLOW-ENTER` is swallowed without a trace on screen (as Gemini CLI did under
heavy load: the message left in its input box) and logged as `{"swallowed": true}`. After a line
containing `SWALLOW-ASK` it is swallowed the same way, and a `(y/n)` question is drawn on the
first row, the cursor left after the line (a permission dialog opening as a message is submitted).
After a line containing `SWALLOW-TICK` it is swallowed the same way, and from then on a counter
is redrawn on the first row every 200 ms, the cursor put back after the line (a CLI whose clock
or spinner never lets its screen go quiet); a key typed while it ticks is logged as
`{"typed": "<key>"}`. The first Enter after a line containing `SWALLOW-NEWLINE` is taken as a new
line inside the input box, as Gemini CLI takes a return close behind a paste (logged as
`{"newline": true}`), and the box is redrawn the way Ink redraws it, in two writes 50 ms apart:
first its row erased (the cursor at the margin of an empty row), then the line again and a new,
empty row under it with the cursor indented past the prompt.
"""
import json
import os
import select
import sys
import termios
import time
import tty

START, END = b"\x1b[200~", b"\x1b[201~"


def main():
    log = open(sys.argv[1], "a", buffering=1)
    saved = termios.tcgetattr(0)
    tty.setraw(0)
    try:
        os.write(1, b"\x1b[?2004hrawcli ready\r\nrawcli> ")
        pending, line, in_paste, hung, swallowed = b"", b"", False, False, False
        ticking, ticks = False, 0
        while True:
            if ticking and not select.select([0], [], [], 0.2)[0]:
                ticks += 1
                os.write(1, b"\x1b7\x1b[1;1H\x1b[2Ktick %d\x1b8" % ticks)
                continue
            data = os.read(0, 4096)
            if not data:
                return 0
            pending += data
            while pending:
                if pending.startswith(START):
                    in_paste, pending = True, pending[len(START):]
                    continue
                if pending.startswith(END):
                    in_paste, pending = False, pending[len(END):]
                    continue
                if (START.startswith(pending) or END.startswith(pending)) and len(pending) < len(START):
                    break  # the rest of a marker is still to come
                key, pending = pending[:1], pending[1:]
                if not in_paste and hung and key < b" ":
                    log.write(json.dumps({"ignored": key.hex()}) + "\n")
                    os.write(1, b"\r\nrawcli: still busy\r\n")
                    continue
                if not in_paste and key in (b"\x03", b"\x04", b"\x1c"):
                    log.write(json.dumps({"control": key.hex()}) + "\n")
                    os.write(1, b"\r\nrawcli: ended by a control key\r\n")
                    return 1
                if not in_paste and key in (b"\r", b"\n") and b"SWALLOW-NEWLINE" in line and not swallowed:
                    swallowed = True
                    log.write(json.dumps({"newline": True}) + "\n")
                    os.write(1, b"\r\x1b[2K")
                    time.sleep(0.05)
                    os.write(1, b"rawcli> " + line + b"\r\n" + b" " * len(b"rawcli> "))
                    continue
                swallow = b"SWALLOW-ENTER" in line or b"SWALLOW-ASK" in line or b"SWALLOW-TICK" in line
                if not in_paste and key in (b"\r", b"\n") and swallow and not swallowed:
                    swallowed = True
                    log.write(json.dumps({"swallowed": True}) + "\n")
                    if b"SWALLOW-ASK" in line:
                        os.write(1, b"\x1b7\x1b[1;1H\x1b[2KAllow the tool to run? (y/n)\x1b8")
                    ticking = b"SWALLOW-TICK" in line
                    continue
                if not in_paste and key in (b"\r", b"\n"):
                    swallowed = False
                    log.write(json.dumps({"line": line.decode("utf-8", "replace")}) + "\n")
                    os.write(1, b"\r\nrawcli: got %d bytes\r\n" % len(line))
                    if b"HANG-NOW" in line:
                        hung = True
                        os.write(1, b"rawcli: working for ever\r\n")
                    elif b"ASK-NOW" in line:
                        os.write(1, b"Do you want to proceed? (y/n) ")
                    else:
                        os.write(1, b"rawcli> ")
                    line = b""
                    continue
                if ticking and not in_paste:
                    log.write(json.dumps({"typed": key.decode("utf-8", "replace")}) + "\n")
                line += key
                os.write(1, key if key >= b" " else b"?")
    finally:
        termios.tcsetattr(0, termios.TCSANOW, saved)


if __name__ == "__main__":
    sys.exit(main())
