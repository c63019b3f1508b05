#!/usr/bin/env python3
"""Writes the wire_parse_fuzz seed corpus: a few valid RoCEv2 packets (BTH .. ICRC), built
here from the IBA field layout with zlib.crc32 for the ICRC (Annex A17.3.3), for the context
the fuzzer uses: 10.0.0.1 -> 10.0.0.2, IP id 0, DF, UDP 4791 -> 4791.
Run from anywhere: python3 make_corpus.py"""
import os
import struct
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "wire_parse_fuzz")


def bth(op, qpn, psn, pad, se=0, mig=1, ack=0, pkey=0xFFFF):
    return struct.pack("!BBHI I", op, se << 7 | mig << 6 | pad << 4, pkey, qpn & 0xFFFFFF,
                       ack << 31 | (psn & 0xFFFFFF))


def icrc(ib):
    udp_len = 8 + len(ib) + 4
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0xFF, 20 + udp_len, 0, 0x4000, 0xFF, 17, 0xFFFF,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    udp = struct.pack("!HHHH", 4791, 4791, udp_len, 0xFFFF)
    masked = b"\xff" * 8 + ip + udp + ib[:4] + b"\xff" + ib[5:]
    return struct.pack("<I", zlib.crc32(masked))


def packet(op, ext, payload, **kw):
    pad = (4 - len(payload) % 4) % 4
    ib = bth(op, kw.pop("qpn", 0x11), kw.pop("psn", 0), pad, **kw) + ext + payload + b"\0" * pad
    return ib + icrc(ib)


reth = struct.pack("!QII", 0x7F0000001000, 0x1234, 64)
aeth = struct.pack("!I", 0x1F << 24 | 7)  # ACK, credits invalid, MSN 7
atomic = struct.pack("!QIQQ", 0x7F0000002000, 0x99, 1, 0)
deth = struct.pack("!IB3s", 0x11111111, 0, (0x000123).to_bytes(3, "big"))
imm = struct.pack("!I", 0xC0FFEE00)

seeds = {
    "rc_send_only_hello": packet(0x04, b"", b"hello", ack=1),
    "rc_send_first_mtu256": packet(0x00, b"", bytes(range(256)), psn=0xFFFFFF),
    "rc_send_last_imm": packet(0x03, imm, b"abc", se=1, ack=1),
    "rc_write_only_imm": packet(0x0B, reth + imm, b"x" * 64, ack=1),
    "rc_read_request": packet(0x0C, reth, b"", ack=1),
    "rc_read_response_middle": packet(0x0E, b"", b"\xa5" * 1024),
    "rc_acknowledge": packet(0x11, aeth, b""),
    "rc_atomic_acknowledge": packet(0x12, aeth + struct.pack("!Q", 42), b""),
    "rc_compare_swap": packet(0x13, atomic, b"", ack=1),
    "ud_send_only_imm": packet(0x65, deth + imm, b"datagram!", qpn=0x000200),
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {OUT}")
