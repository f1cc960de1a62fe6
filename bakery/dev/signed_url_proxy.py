"""A proxy in front of act's artifact server that makes its signed URLs readable by the artifact
actions (nektos/act#6021): the one workaround the rehearsal needs in act itself."""

from __future__ import annotations

import threading


class SignedUrlProxy:
    """In front of act's artifact server, for the jobs: its answers with each signed URL's `sig`
    percent-encoded. act 0.2.89 signs its artifact URLs with padded base64 left raw (`sig=...=`), and
    the blob client of upload-artifact 6 and download-artifact 7 cuts a query value at its first
    '=', so every upload was refused ("Error unauthorized", nektos/act#6021). Nothing else changes:
    requests go through as sent, and the blobs themselves go to act's server directly."""

    def __init__(self, upstream: int):
        import http.client
        import http.server
        import re
        import urllib.parse

        def quoted(match) -> bytes:
            return b"sig=" + urllib.parse.quote(urllib.parse.unquote(match.group(1).decode()), safe="").encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=600)
                try:
                    conn.request(self.command, self.path, body=body,
                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                    resp = conn.getresponse()
                    data = re.sub(rb"sig=([^&\"\\]*)", quoted, resp.read())
                except (OSError, http.client.HTTPException):  # act's server not up yet, or gone: the client retries
                    self.send_error(502)
                    return
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SignedUrlProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
