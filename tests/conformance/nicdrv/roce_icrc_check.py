#!/usr/bin/env python3
"""Recompute the RoCEv2 ICRC of every packet in a pcap with Scapy's own RoCE layer
(scapy.contrib.roce.BTH.compute_icrc, IBA Annex A17.3.3) and compare it with the packet's
last four bytes. Prints one line per frame; exits 1 if any frame is bad or not RoCEv2."""
import sys

from scapy.all import rdpcap
from scapy.contrib.roce import BTH

bad = 0
for n, pkt in enumerate(rdpcap(sys.argv[1]), start=1):
    if BTH not in pkt:
        print(f"frame {n} BAD not RoCEv2")
        bad += 1
        continue
    wire = bytes(pkt.original)[-4:]
    want = pkt[BTH].compute_icrc(None)
    status = "ok" if wire == want else "BAD"
    bad += status != "ok"
    print(f"frame {n} {status} opcode=0x{pkt[BTH].opcode:02x} wire={wire.hex()} scapy={want.hex()}")
sys.exit(1 if bad else 0)
