"""A byte relay from a Unix socket to chromedriver's TCP port, run inside the browser's sandbox.

The sandbox's network namespace has only its own loopback, so the host cannot open a TCP
connection to chromedriver; it can reach a Unix socket on the sandbox's filesystem (through
/proc/PID/root). This script, run by the sandbox's python3 (standard library only, never imported
by clawrl), listens on that socket and copies the bytes of each connection to and from
chromedriver's port, both ways, until either side closes.

    python3 relay.py SOCKET_PATH PORT
"""

import os
import socket
import sys
import threading


def copy(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until `source` ends, then tell `sink` that nothing more comes."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass  # the other side went away: the connection is over either way
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(path: str, port: int) -> None:
    listener = socket.socket(socket.AF_UNIX)
    # bound under a temporary name and renamed: the socket appears only once it accepts connections
    listener.bind(path + ".new")
    listener.listen(16)
    os.rename(path + ".new", path)
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", port))
        except OSError:  # chromedriver is not listening yet: the client sees a closed connection and retries
            client.close()
            continue
        threading.Thread(target=copy, args=(client, upstream), daemon=True).start()
        threading.Thread(target=copy, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
