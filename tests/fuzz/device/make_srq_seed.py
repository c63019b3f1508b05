#!/usr/bin/env python3
# A seed for rdma_command_fuzzer that reaches SRQs and their migration (state version 6):
# CREATE_PD, REG_DMA_MR (the receives' key), CREATE_CQ, CREATE_SRQ with its ring where the fuzzer
# writes requests (1 MiB), CREATE_QP on that SRQ, a "request" that fills the SRQ's ring with 7
# receives (slot 0 is where the doorbell record lands: refused), the SRQ doorbell, and a save and load of the device state (the SRQ's record and the
# engine's receives not yet taken). Writes the seed under its SHA-1 name.
# Usage: make_srq_seed.py tests/fuzz/device/corpus/rdma_command_fuzzer LKEY (the DMA MR's: 0x102)
import struct, hashlib, sys
def rec(tag, body): return struct.pack('<BH', tag, len(body)) + body
def cmd(c, body=b''): return rec(0, struct.pack('<II', c, 0) + body)
lkey = int(sys.argv[2], 0)
out = b''
out += cmd(4)                                              # CREATE_PD -> 1
out += cmd(19, struct.pack('<II', 1, 1))                   # REG_DMA_MR pd 1, local write -> 2
out += cmd(8, struct.pack('<IIQ', 16, 0, 0x200000))        # CREATE_CQ -> 3
out += cmd(16, struct.pack('<IIIIQQ', 1, 8, 1, 0, 0x100000, 0x301000))  # CREATE_SRQ (ring at 1 MiB) -> 4
out += cmd(10, struct.pack('<IIIIBBHIIIIIQQQ', 1, 3, 3, 4, 2, 0, 0, 4, 0, 1, 1, 0,
                           0x302000, 0, 0x303000))          # CREATE_QP on SRQ 4 -> 5
ring = bytes(32)
for i in range(1, 8):                                      # 7 receives of 256 bytes, stride 32
    ring += struct.pack('<QII', 0x500 + i, 1, 0) + struct.pack('<QII', 0x400000 + 256 * i, 256, lkey)
out += rec(2, ring)                                        # fills the SRQ's ring (a refused command)
out += rec(1, struct.pack('<IHHII', 4, 3, 0, 8, 0))        # SRQ doorbell: producer 8
out += rec(0xfd, b'')                                      # save and load: the SRQ in the state
name = hashlib.sha1(out).hexdigest()
open(sys.argv[1] + '/' + name, 'wb').write(out)
print(name)
