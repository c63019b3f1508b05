#!/usr/bin/env python3
"""Writes the cm_mad_fuzz seed corpus: one 256-byte CM MAD of each attribute (REQ, MRA, REJ,
REP, RTU, DREQ, DREP), laid out here from IBA vol 1 tables 106-113, the REQ with an RDMA-CM
header (cma.c's struct cma_hdr) in its private data. Run from anywhere: python3 make_cm_corpus.py"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "cm_mad_fuzz")


def mad(attr, data):
    hdr = struct.pack("!BBBBHHQHHI", 1, 0x07, 2, 0x03, 0, 0, 0x1122334455667788, attr, 0, 0)
    return hdr + data + b"\0" * (232 - len(data))


def gid4(a, b, c, d):
    return b"\0" * 10 + b"\xff\xff" + bytes([a, b, c, d])


req = bytearray(232)
struct.pack_into("!I", req, 0, 0x1234)                    # local comm ID
struct.pack_into("!Q", req, 8, 0x0000000001061C06)        # RDMA_PS_TCP, port 7174
struct.pack_into("!Q", req, 16, 0x0200C0FFFE0A0001)       # local CA GUID
struct.pack_into("!I", req, 32, 0x11 << 8 | 1)            # QPN 0x11, responder resources 1
struct.pack_into("!I", req, 36, 1)                        # initiator depth 1
req[43] = 20 << 3 | 1                                     # remote resp timeout, RC, flow control
struct.pack_into("!I", req, 44, 0xABCDEF << 8 | 20 << 3 | 7)
struct.pack_into("!H", req, 48, 0xFFFF)
req[50] = 5 << 4 | 7                                      # MTU 4096, RNR retry 7
req[51] = 15 << 4                                         # max CM retries
struct.pack_into("!HH", req, 52, 0xFFFF, 0xFFFF)
req[56:72] = gid4(10, 91, 0, 2)
req[72:88] = gid4(10, 91, 0, 1)
req[91] = 3
req[93] = 64
req[95] = 17 << 3
req[140:144] = bytes([0, 0x40, 0xC0, 0x01])               # cma header: v0, IPv4, port 0xc001
req[144 + 12:144 + 16] = bytes([10, 91, 0, 2])
req[160 + 12:160 + 16] = bytes([10, 91, 0, 1])

rep = bytearray(232)
struct.pack_into("!IIII", rep, 0, 0x5678, 0x1234, 0, 0x12 << 8)
struct.pack_into("!I", rep, 20, 0x123456 << 8)
rep[24], rep[25], rep[26], rep[27] = 1, 1, 0x01, 7 << 5
struct.pack_into("!Q", rep, 28, 0x0200C0FFFE0A0002)

seeds = {
    "req_rdma_cm": mad(0x10, bytes(req)),
    "mra_req": mad(0x11, struct.pack("!IIBB", 0x5678, 0x1234, 0, 21 << 3)),
    "rej_invalid_service_id": mad(0x12, struct.pack("!IIBBH", 0, 0x1234, 0, 0, 8)),
    "rep": mad(0x13, bytes(rep)),
    "rtu": mad(0x14, struct.pack("!II", 0x1234, 0x5678)),
    "dreq": mad(0x15, struct.pack("!III", 0x1234, 0x5678, 0x12 << 8)),
    "drep": mad(0x16, struct.pack("!II", 0x5678, 0x1234)),
}

os.makedirs(OUT, exist_ok=True)
for name, b in seeds.items():
    assert len(b) == 256, name
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(b)
print(f"wrote {len(seeds)} seeds to {OUT}")
