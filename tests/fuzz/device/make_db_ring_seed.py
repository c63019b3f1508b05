#!/usr/bin/env python3
# A seed for rdma_command_fuzzer that reaches doorbell rings (docs/virtio-rdma.md "Doorbell
# rings"): CREATE_PD, CREATE_DB_RING over the fuzzer's request buffer (1 MiB, where every
# control request is written: later "requests" write the ring), CREATE_CQ and CREATE_QP naming
# that ring, a "request" whose bytes are the ring's header (producer 24) and three records (RQ,
# CQ_ARM, SQ) in the slots after the 21 the ring started at, a doorbell on the doorbell queue
# (written at the same place: its handle is the producer again; its notification makes the
# device take the ring's records), and a save and load of the
# device state (the ring and the objects' ring in version 5). Writes the seed under its SHA-1
# name.
# Usage: make_db_ring_seed.py tests/fuzz/device/corpus/rdma_command_fuzzer
import struct, hashlib, sys
def rec(tag, body): return struct.pack('<BH', tag, len(body)) + body
def cmd(c, body=b''): return rec(0, struct.pack('<II', c, 0) + body)
out = b''
out += cmd(4)                                              # CREATE_PD -> 1
out += cmd(21, struct.pack('<QII', 0x100000, 8, 0))        # CREATE_DB_RING at 1 MiB, 8 records -> ring 1 (producer 21 there)
out += cmd(8, struct.pack('<IIQ', 16, 1, 0x200000))        # CREATE_CQ, ring 1 -> 2
out += cmd(10, struct.pack('<IIIIBBHIIIIIQQQ', 1, 2, 2, 0, 2, 0, 1, 4, 4, 1, 1, 0,
                           0x300000, 0x301000, 0x302000))   # CREATE_QP (RC), ring 1 -> 3
ring = bytearray(64 + 8 * 16)
ring[0:8] = struct.pack('<II', 24, 21)                     # producer 24: three records after 21
for slot, (h, kind, value) in zip((5, 6, 7), ((3, 2, 0), (2, 4, 0), (3, 1, 1))):
    ring[64 + slot * 16:64 + slot * 16 + 16] = struct.pack('<IHHII', h, kind, 0, value, 0)
out += rec(2, bytes(ring))                                 # writes the ring (a refused command 24)
# A doorbell-queue record (refused: no object 24), written where requests are: its first word is
# the ring's producer again; its notification makes the device take the ring's three records.
out += rec(1, struct.pack('<IHHII', 24, 1, 0, 0, 0))
out += rec(0xfd, b'')                                      # save and load: the ring in the state
name = hashlib.sha1(out).hexdigest()
open(sys.argv[1] + '/' + name, 'wb').write(out)
print(name)
