#!/usr/bin/env python3
"""One QEMU-driven move with the guest memory check (vm_lib.sh migrate), over the two QEMUs'
human monitors, kept open so that the guest's pause stays short (its RDMA peers retransmit
for ~4 s before they give up):
  hmp_move.py SRC_MONITOR DST_MONITOR URI MAX_BANDWIDTH_BYTES -- CHECK_COMMAND...
sets the source's max-bandwidth, starts `migrate -d URI`, polls the source every 20 ms until the
migration ends, waits for the destination (started with -S) to hold the whole memory, paused,
runs CHECK_COMMAND (the memory comparison; its output goes to stderr), then `cont`s the
destination when the check passed (exit 0). When it did not:
  --cont-anyway            the destination runs all the same (a study of what follows);
  --abandon-if-vmm REPORT  when the comparison's JSON report says no differing page is the
                           backend's and the backend wrote nothing after the stop (QEMU lost
                           them), the destination quits and the source runs on at once, so
                           that the move can be made again; otherwise both stay paused.
Prints one JSON object: status, QEMU's own figures, the check's exit status, whether the
destination runs or the move was abandoned, and where the pause went (ms). Exits 0 when the
migration completed (and the check ran), 1 otherwise."""
import json
import socket
import subprocess
import sys
import time


class Hmp:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.s.settimeout(20)
        self._read_prompt()

    def _read_prompt(self):
        buf = b""
        while not buf.endswith(b"(qemu) "):
            chunk = self.s.recv(65536)
            if not chunk:
                raise RuntimeError("the monitor closed")
            buf += chunk
        return buf.decode(errors="replace").replace("\r", "")

    def cmd(self, line):
        self.s.sendall(line.encode() + b"\n")
        out = self._read_prompt()
        # The echo of the command line, then its output, then the prompt.
        return out.split("\n", 1)[-1].rsplit("(qemu)", 1)[0]


def field(text, name):
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def main():
    args = sys.argv[1:]
    anyway = bool(args) and args[0] == "--cont-anyway"
    if anyway:
        args = args[1:]
    abandon_report = None
    if len(args) > 1 and args[0] == "--abandon-if-vmm":
        abandon_report, args = args[1], args[2:]
    if len(args) < 5 or args[4] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = Hmp(args[0]), Hmp(args[1])
    uri, limit, check = args[2], args[3], args[5:]
    out = {}
    src.cmd("migrate_set_parameter max-bandwidth " + limit)
    t0 = time.monotonic()
    src.cmd("migrate -d " + uri)
    status, info = "", ""
    while time.monotonic() - t0 < 120:
        info = src.cmd("info migrate")
        status = field(info, "Migration status")
        if status in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.02)
    t_done = time.monotonic()
    out["status"] = status
    out["wall_ms"] = round((t_done - t0) * 1000)
    for k, name in (("total_ms", "total time"), ("downtime_ms", "downtime")):
        v = field(info, name).split()
        out[k] = int(v[0]) if v and v[0].isdigit() else None
    if status != "completed":
        print(json.dumps(out))
        return 1
    vm = ""
    while time.monotonic() - t_done < 30:
        vm = field(dst.cmd("info status"), "VM status")
        if vm == "paused":
            break
        time.sleep(0.01)
    t_paused = time.monotonic()
    out["destination_in_ms"] = round((t_paused - t_done) * 1000)
    if vm != "paused":
        out["status"] = "the destination is '%s', not paused with the memory in, 30 s after the source completed" % vm
        print(json.dumps(out))
        return 1
    out["check_status"] = subprocess.run(check, stdout=sys.stderr).returncode
    t_checked = time.monotonic()
    out["check_ms"] = round((t_checked - t_paused) * 1000)
    out["running"] = out["check_status"] == 0 or anyway
    out["abandoned"] = False
    if out["running"]:
        dst.cmd("cont")
        out["cont_ms"] = round((time.monotonic() - t_checked) * 1000)
    elif out["check_status"] == 1 and abandon_report:
        with open(abandon_report) as f:
            rep = json.load(f)
        if rep["backend_pages"] == 0 and rep["journal_after_stop"] == 0:
            dst.s.sendall(b"quit\n")
            src.cmd("cont")
            out["abandoned"] = True
            out["cont_ms"] = round((time.monotonic() - t_checked) * 1000)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
