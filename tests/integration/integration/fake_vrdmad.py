#!/usr/bin/env python3
# A stand-in for vrdmad for the hook and `vrdmactl device` tests: binds --socket (accepts and
# ignores connections) and answers --control the way vrdmad's control socket does. FAKE_MODE:
#   ok      migrate -> armed, state-sent, handed-over, migrated (0.2 s apart)
#   fail    migrate -> armed, then failed with a message
#   refuse  migrate -> {"ok":false,"error":...}
#   stuck   migrate -> armed forever
#   die     exits at start after printing a reason
# Its argv goes to <socket>.args.
import json, os, socket, sys, threading, time

args = sys.argv[1:]
opt = {args[i]: args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "die":
    print("fake vrdmad: cannot open engine soft:10.0.0.9: no such address", flush=True)
    sys.exit(1)
with open(opt["--socket"] + ".args", "w") as f:
    f.write(" ".join(args) + "\n")
state = {"phase": "incoming" if "--incoming" in opt else "idle", "message": ""}

def steps(seq):
    for p, m in seq:
        time.sleep(0.2)
        state["phase"], state["message"] = p, m

def serve(path, control):
    s = socket.socket(socket.AF_UNIX)
    if control and os.path.exists(path):
        os.unlink(path)  # as vrdmad does: a control socket left by a backend that died
    s.bind(path)
    s.listen(8)
    while True:
        c, _ = s.accept()
        if not control:
            continue
        line = c.makefile().readline()
        req = json.loads(line)
        if req["cmd"] == "status":
            rep = {"migration": dict(state)}
        elif req["cmd"] == "migrate":
            if mode == "refuse":
                rep = {"ok": False, "error": "the destination refused the device: its engine has no port 1"}
            else:
                state["phase"] = "armed"
                seq = {"ok": [("state-sent", ""), ("handed-over", ""), ("migrated", "")],
                       "fail": [("failed", "the destination closed the connection before LOADED")],
                       "stuck": []}[mode]
                threading.Thread(target=steps, args=(seq,), daemon=True).start()
                rep = {"ok": True, "migration": dict(state)}
        else:
            rep = {"error": "unknown command"}
        c.sendall((json.dumps(rep) + "\n").encode())
        c.close()

threading.Thread(target=serve, args=(opt["--socket"], False), daemon=True).start()
serve(opt["--control"], True)
