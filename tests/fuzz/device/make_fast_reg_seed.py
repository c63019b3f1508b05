#!/usr/bin/env python3
# A seed for rdma_command_fuzzer that reaches fast registration (docs/virtio-rdma.md "Fast
# registration"): CREATE_PD, ALLOC_MR, CREATE_CQ, CREATE_QP with its send ring where the fuzzer
# writes requests (1 MiB), a "request" that fills the ring with REG_MR, LOCAL_INV and SEND with
# Invalidate WQEs and the page list, the SQ doorbell, and a save and load of the device state
# (the fast region's record). Writes the seed under its SHA-1 name.
# Usage: make_fast_reg_seed.py tests/fuzz/device/corpus/rdma_command_fuzzer
import struct, hashlib, sys
def rec(tag, body): return struct.pack('<BH', tag, len(body)) + body
def cmd(c, body=b''): return rec(0, struct.pack('<II', c, 0) + body)
out = b''
out += cmd(4)                                              # CREATE_PD -> 1
out += cmd(20, struct.pack('<II', 1, 8))                   # ALLOC_MR pd 1, 8 pages -> 2
out += cmd(8, struct.pack('<IIQ', 16, 0, 0x200000))        # CREATE_CQ -> 3
out += cmd(10, struct.pack('<IIIIBBHIIIIIQQQ', 1, 3, 3, 0, 2, 0, 0, 4, 4, 1, 1, 0,
                           0x100000, 0x300000, 0x301000))   # CREATE_QP (send ring at 1 MiB) -> 4
ring = bytearray(512)
key = 0x80000001
# slot 1: REG_MR of 3 pages, 512 bytes into the first
ring[128:192] = struct.pack('<QBBBBIQIIQQIIQ', 0x11, 0x20, 2, 0, 0, key, 0x1200, 2, 7, 0x2e00,
                            0x100000 + 448, 3, 12, 0)
# slot 2: LOCAL_INV of that key; slot 3: SEND with Invalidate, no SGEs
ring[256:320] = struct.pack('<QBBBBIQIIQQIIII', 0x12, 7, 2, 0, 0, key, 0, 0, 0, 0, 0, 0, 0, 0, 0)
ring[384:448] = struct.pack('<QBBBBIQIIQQIIII', 0x13, 9, 2, 0, 0, key, 0, 0, 0, 0, 0, 0, 0, 0, 0)
ring[448:472] = struct.pack('<QQQ', 0x400000, 0x401000, 0x402000)  # the page list (one run: the fuzzer's RAM has no fd to map a window from)
out += rec(2, bytes(ring))                                 # fills the send ring (a refused command)
out += rec(1, struct.pack('<IHHII', 4, 1, 0, 4, 0))        # SQ doorbell: producer 4
out += rec(0xfd, b'')                                      # save and load: the fast region in the state
name = hashlib.sha1(out).hexdigest()
open(sys.argv[1] + '/' + name, 'wb').write(out)
print(name)
