#!/usr/bin/env python3
"""A stand-in Kubernetes API server for bench/records.sh: N FlexdRecord objects in memory.

HTTPS on 127.0.0.1 (stdlib only). It holds N records of one driver, each the object flexd's
KubernetesStore writes for a provisioned volume (crates/flexd/src/serve/kubernetes_records.rs:
its name, its driver label; the spec a ControllerRecord), generated at start and serialized
once, so that a list costs the stand-in little more than a join.

It answers what the store asks:
  GET  .../namespaces/<ns>/flexdrecords?labelSelector=&limit=&continue=   a page, in name order
  GET  .../namespaces/<ns>/flexdrecords/<name>                          one object
and refuses anything else, counted (405 for a write, 404 for another path). The continue token is opaque, of the API server's
shape: base64 of {"v","rv","start"}, resumed after the name it carries; one that does not
decode is 400, as the API server answers.

GET /_bench/stats (no token needed) answers what it was asked, as JSON: every list, those
without a limit, the largest limit, single GETs, requests refused, and its own peak RSS.

Usage: records_apiserver.py --records N --cert C --key K --token-file T --namespace NS
                            --port-file F [--driver bench/prov]
"""

import argparse
import base64
import http.server
import json
import os
import socket
import ssl
import sys
import threading
import urllib.parse
from bisect import bisect_right

GROUP_VERSION = "flexd.io/v1alpha1"


def fnv(data: bytes) -> int:
    """FNV-1a 64, as flexd's `fnv` (kubernetes_records.rs)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def driver_label(driver: str) -> str:
    return "%016x" % fnv(driver.encode())


def object_name(driver: str, volume: str) -> str:
    key = ("%s\0%s" % (driver, volume)).encode()
    return "v-%016x%016x" % (fnv(key), fnv(key[::-1]))


def make_objects(n, driver, namespace):
    """The N objects, serialized, sorted by name (the API server lists in key order)."""
    label = driver_label(driver)
    objects = []
    for i in range(n):
        volume = "pvc-%d" % i
        spec = {
            "driver": driver,
            "volume": volume,
            "fences": 1,
            "provisioned": {
                "name": volume,
                "driver": driver,
                "capacity_bytes": 1048576,
                "fs_type": "ext4",
                "parameters": {},
                "options": {"pool": "p"},
                "done": True,
            },
        }
        name = object_name(driver, volume)
        obj = {
            "apiVersion": GROUP_VERSION,
            "kind": "FlexdRecord",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": str(i + 1),
                "labels": {"flexd.io/driver": label},
            },
            "spec": spec,
        }
        objects.append((name, json.dumps(obj, separators=(",", ":")).encode()))
    objects.sort()
    return label, [o[0] for o in objects], [o[1] for o in objects]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.lists = 0
        self.unlimited_lists = 0
        self.largest_limit = 0
        self.gets = 0
        self.refused = 0
        self.unauthorized = 0

    def as_json(self):
        with self.lock:
            d = {k: v for k, v in vars(self).items() if k != "lock"}
        d["vmhwm_kib"] = vmhwm_kib()
        return d


def vmhwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def status_body(code, reason, message):
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--driver", default="bench/prov")
    p.add_argument("--namespace", default="flexd-system")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--port-file", required=True)
    args = p.parse_args()

    label, names, bodies = make_objects(args.records, args.driver, args.namespace)
    by_name = dict(zip(names, bodies))
    list_rv = str(args.records)
    with open(args.token_file) as f:
        bearer = "Bearer " + f.read().strip()
    prefix = "/apis/%s/namespaces/%s/flexdrecords" % (GROUP_VERSION, args.namespace)
    stats = Stats()
    selector_ok = {"", "flexd.io/driver=" + label}

    def continue_token(last_name):
        raw = {"v": "meta.k8s.io/v1", "rv": int(list_rv), "start": last_name + "\0"}
        return base64.b64encode(json.dumps(raw, separators=(",", ":")).encode()).decode()

    def resume_index(token):
        """The index after the name the token carries; None: not a token of ours."""
        try:
            raw = json.loads(base64.b64decode(token, validate=True))
            start = raw["start"]
            assert raw["v"] == "meta.k8s.io/v1" and start.endswith("\0")
        except Exception:
            return None
        return bisect_right(names, start[:-1])

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            # Headers and body are two writes: without this, Nagle holds the body back until
            # the client's delayed ACK of the headers (40 ms).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *a):
            pass

        def reply(self, code, body):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def refuse(self, code, reason):
            with stats.lock:
                stats.refused += 1
            self.reply(code, status_body(code, reason, "%s %s" % (self.command, self.path)))

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/_bench/stats":
                return self.reply(200, json.dumps(stats.as_json()).encode())
            if self.headers.get("Authorization") != bearer:
                with stats.lock:
                    stats.unauthorized += 1
                return self.reply(401, status_body(401, "Unauthorized", "no valid token"))
            if url.path == prefix:
                return self.list(urllib.parse.parse_qs(url.query))
            if url.path.startswith(prefix + "/") and "/" not in url.path[len(prefix) + 1 :]:
                with stats.lock:
                    stats.gets += 1
                body = by_name.get(url.path[len(prefix) + 1 :])
                if body is None:
                    return self.reply(404, status_body(404, "NotFound", "not found"))
                return self.reply(200, body)
            self.refuse(404, "NotFound")

        def list(self, query):
            one = lambda key: query.get(key, [""])[0]
            limit = int(one("limit") or 0)
            with stats.lock:
                stats.lists += 1
                if limit <= 0:
                    stats.unlimited_lists += 1
                stats.largest_limit = max(stats.largest_limit, limit)
            if one("labelSelector") not in selector_ok:
                start, end = 0, 0  # no object has another driver's label
            else:
                start, end = 0, len(names)
            if one("continue"):
                start = resume_index(one("continue"))
                if start is None:
                    return self.reply(400, status_body(400, "BadRequest", "invalid continue"))
            stop = min(end, start + limit) if limit > 0 else end
            more = ""
            if stop < end:
                more = continue_token(names[stop - 1])
            head = json.dumps(
                {"continue": more, "resourceVersion": list_rv}, separators=(",", ":")
            ).encode()
            body = b"".join(
                [
                    b'{"kind":"FlexdRecordList","apiVersion":"',
                    GROUP_VERSION.encode(),
                    b'","metadata":',
                    head,
                    b',"items":[',
                    b",".join(bodies[start:stop]),
                    b"]}",
                ]
            )
            self.reply(200, body)

        def do_POST(self):
            self.refuse(405, "MethodNotAllowed")

        do_PUT = do_PATCH = do_DELETE = do_POST

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 64

    server = Server(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
    os.rename(tmp, args.port_file)
    print(
        "stand-in API server on 127.0.0.1:%d with %d records" % (port, len(names)),
        file=sys.stderr,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
