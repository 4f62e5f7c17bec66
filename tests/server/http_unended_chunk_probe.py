"""What one client costs the HTTP port when it sends a chunked request whose chunk-size line never
ends (an extension that opens a quoted string and never closes it): starts modserve on a model,
streams that line for SECONDS, and prints the server's resident memory before and after, the
bytes sent, and the answer (docs/RELIABILITY.md quotes it). A probe, not a test:
HttpServerTest.AChunkLineThatNeverEndsIs400AtTheInputBoundNotBuffered holds the behaviour.
Usage: http_unended_chunk_probe.py MODSERVE MODEL [SECONDS (default 8)]"""

import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return -1


def main():
    binary, model = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 8.0
    port = free_port()
    server = subprocess.Popen(
        [binary, "--model", model, "--port", "0", "--http_port", str(port), "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    sys.exit("modserve did not open its HTTP port")
                time.sleep(0.2)
        print(f"resident before: {rss_kb(server.pid)} kB")
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n10;e=\"")
        blob, sent, start = b"a" * 65536, 0, time.time()
        try:
            while time.time() - start < seconds:
                conn.sendall(blob)
                sent += len(blob)
        except OSError as e:
            print(f"sending stopped: {e}")
        print(f"sent {sent / 2**20:.1f} MiB in {time.time() - start:.1f} s; "
              f"resident after: {rss_kb(server.pid)} kB")
        conn.settimeout(5)
        try:
            print("answer:", conn.recv(400).decode(errors="replace").split("\r\n")[0])
        except OSError as e:
            print(f"no answer: {e}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
