"""A local stand-in for the Hugging Face Hub, for the push_to_hub tests (no network)."""

import json


class FakeHub:
    """Just enough of the Hub's HTTP API for huggingface_hub's create_repo + create_commit: the real client path of
    `PreTrainedModel.push_to_hub`, with the committed files written to a folder."""

    def __init__(self, folder):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        hub = self
        self.folder, self.commits = folder, 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, payload):
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self.reply(404, {"error": "not found"})

            def do_HEAD(self):
                self.send_response(404)
                self.end_headers()

            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.startswith("/api/repos/create"):
                    body = json.loads(data)
                    name = f"{body['organization']}/{body['name']}"
                    return self.reply(200, {"url": f"{hub.endpoint}/{name}", "name": name})
                if self.path.startswith("/api/validate-yaml"):
                    return self.reply(200, {})
                if "/preupload/" in self.path:
                    files = json.loads(data)["files"]
                    return self.reply(
                        200,
                        {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]},
                    )
                if "/commit/" in self.path:
                    hub.receive_commit(data)
                    return self.reply(200, {"commitUrl": f"{hub.endpoint}/c/{'a' * 40}", "commitOid": "a" * 40})
                self.reply(404, {"error": f"unexpected {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive_commit(self, data):
        import base64

        for line in data.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                path = self.folder / item["value"]["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(item["value"]["content"]))
        self.commits += 1
