#!/usr/bin/env python3
"""The ListVolumes client of bench/records.sh: walks a driver's whole listing through flexd's
CSI socket, WALKS times, with grpcio and hand-encoded protobuf (csi.proto: ListVolumesRequest
max_entries = 1, starting_token = 2; ListVolumesResponse entries = 1, next_token = 2; Entry
volume = 1; Volume volume_id = 2).

Every walk must return every volume once. Prints one JSON object: the pages of each walk, each
page's latency (ms), each walk's time (s), the entries of the last walk (all, distinct) and,
given flexd's PID, its peak RSS (VmHWM, KiB) after each walk.

Usage: records_list.py SOCKET EXPECTED [WALKS=3] [PID] [MAX_ENTRIES=0]
"""

import json
import sys
import time

import grpc


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def request(max_entries, token):
    out = b""
    if max_entries:
        out += b"\x08" + varint(max_entries)
    if token:
        t = token.encode()
        out += b"\x12" + varint(len(t)) + t
    return out


def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def fields(buf):
    """(field number, value) of a message: bytes for length-delimited, int for varints."""
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2:
            size, i = read_varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        yield number, value


def response(buf):
    ids, token = [], ""
    for number, value in fields(buf):
        if number == 1:
            volume_id = None
            for n, v in fields(value):
                if n == 1:
                    for n2, v2 in fields(v):
                        if n2 == 2:
                            volume_id = bytes(v2).decode()
            ids.append(volume_id)
        elif number == 2:
            token = bytes(value).decode()
    return ids, token


def vmhwm_kib(pid):
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise ValueError("no VmHWM for process %s" % pid)


def main():
    socket, expected = sys.argv[1], int(sys.argv[2])
    walks = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    pid = sys.argv[4] if len(sys.argv) > 4 else ""
    max_entries = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    channel = grpc.insecure_channel("unix:" + socket)
    call = channel.unary_unary("/csi.v1.Controller/ListVolumes")
    result = {"pages": [], "page_ms": [], "walk_s": [], "page_sizes": [], "vmhwm_kib": []}
    shown = time.monotonic()
    for walk in range(walks):
        token, pages, seen = "", 0, []
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            answer = call(request(max_entries, token), timeout=60)
            result["page_ms"].append((time.perf_counter() - t0) * 1000)
            ids, token = response(answer)
            pages += 1
            seen.extend(ids)
            result["page_sizes"].append(len(ids))
            if not token:
                break
            if time.monotonic() >= shown + 2:
                shown = time.monotonic()
                print("  walk %d: %d pages, %d volumes" % (walk + 1, pages, len(seen)),
                      file=sys.stderr)
        result["walk_s"].append(time.perf_counter() - started)
        result["pages"].append(pages)
        distinct = len(set(seen))
        if len(seen) != expected or distinct != expected:
            sys.exit(
                "walk %d listed %d volumes (%d distinct), expected %d"
                % (walk + 1, len(seen), distinct, expected)
            )
        peak = ""
        if pid:
            result["vmhwm_kib"].append(vmhwm_kib(pid))
            peak = ", flexd's peak RSS %.1f MiB" % (result["vmhwm_kib"][-1] / 1024)
        if walk in (0, walks - 1) or time.monotonic() >= shown + 2:
            shown = time.monotonic()
            print("  walk %d: %d volumes in %d pages, %.2f s%s"
                  % (walk + 1, len(seen), pages, result["walk_s"][-1], peak), file=sys.stderr)
    result["entries"], result["distinct"] = len(seen), distinct
    print(json.dumps(result))


if __name__ == "__main__":
    main()
