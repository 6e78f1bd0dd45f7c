"""The relay process behind `bash_sandbox.publish`: host connections into the sandbox's loopback.

Run by path (``python -I publish_relay.py``, standard library only, so it starts in tens of
milliseconds) with the executor's namespace descriptors and the host listening sockets
inherited. It joins the executor's user namespace (when it has one) and network namespace,
so every socket it *creates* lives inside the sandbox's network, while the listening
sockets it was handed stay on the host. Each accepted host connection is relayed to
``127.0.0.1:<port>`` (then ``[::1]``) inside; bounded connections and idle time.

It prints ``ready`` once serving, exits when its parent process ends (a pidfd of it:
``PR_SET_PDEATHSIG`` would follow the executor's *thread* that started it, a pool thread),
and is ended by the executor with SIGKILL, which closes the host ports.

Arguments: ``PARENT_PID NET_FD USER_FD|- LISTEN_FD:PORT...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MAX_CONNECTIONS = 64  # per published port
IDLE_TIMEOUT_S = 600.0  # no byte either way for this long: the connection is closed
CONNECT_TIMEOUT_S = 5.0
_CHUNK = 256 * 1024


def _join(libc: ctypes.CDLL, fd: int, kind: int, what: str) -> None:
    if libc.setns(fd, kind) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({what}): {os.strerror(err)}")


async def _pump(src: socket.socket, dst: socket.socket, clock: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while data := await loop.sock_recv(src, _CHUNK):
        clock[0] = loop.time()
        await loop.sock_sendall(dst, data)
        clock[0] = loop.time()
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


async def _connect_inside(port: int) -> socket.socket | None:
    loop = asyncio.get_running_loop()
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = socket.socket(family, socket.SOCK_STREAM)  # made here: inside the namespace
        sock.setblocking(False)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await loop.sock_connect(sock, (host, port))
        except (OSError, TimeoutError):
            sock.close()
            continue
        return sock
    return None


async def _serve_one(client: socket.socket, port: int) -> None:
    loop = asyncio.get_running_loop()
    try:
        inside = await _connect_inside(port)
        if inside is None:
            return  # nothing listens there: the host client sees the connection close
        try:
            clock = [loop.time()]
            pumps = {
                asyncio.create_task(_pump(client, inside, clock)),
                asyncio.create_task(_pump(inside, client, clock)),
            }
            try:
                pending = pumps
                while pending:
                    remaining = clock[0] + IDLE_TIMEOUT_S - loop.time()
                    if remaining <= 0:
                        return
                    done, pending = await asyncio.wait(
                        pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                    )
                    if any(t.exception() is not None for t in done):
                        return
            finally:
                for task in pumps:
                    task.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            inside.close()
    finally:
        client.close()


async def _accept(listener: socket.socket, port: int) -> None:
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    active: set[asyncio.Task[None]] = set()
    while True:
        try:
            client, _ = await loop.sock_accept(listener)
        except OSError:
            await asyncio.sleep(0.05)  # EMFILE and friends: back off, never spin
            continue
        if len(active) >= MAX_CONNECTIONS:
            client.close()
            continue
        client.setblocking(False)
        task = asyncio.create_task(_serve_one(client, port))
        active.add(task)
        task.add_done_callback(active.discard)


async def _main(pairs: list[tuple[socket.socket, int]], parent: int) -> None:
    tasks = [asyncio.create_task(_accept(sock, port)) for sock, port in pairs]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    gone = asyncio.Event()
    try:
        watch = os.pidfd_open(parent)  # readable once the executor's process has ended
    except OSError:
        return  # already gone (ESRCH)
    asyncio.get_running_loop().add_reader(watch, gone.set)
    if os.getppid() == parent:
        await gone.wait()
    for task in tasks:
        task.cancel()


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    parent, net_fd, user_fd, *listens = argv
    if os.getppid() != int(parent):
        return 1  # the executor is already gone
    if user_fd != "-":
        _join(libc, int(user_fd), CLONE_NEWUSER, "user")
    _join(libc, int(net_fd), CLONE_NEWNET, "net")
    for fd in (int(net_fd), *([int(user_fd)] if user_fd != "-" else [])):
        os.close(fd)
    pairs = []
    for item in listens:
        listen_fd, port = item.split(":")
        pairs.append((socket.socket(fileno=int(listen_fd)), int(port)))
    asyncio.run(_main(pairs, int(parent)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as exc:
        sys.stderr.write(f"publish relay: {exc}\n")
        sys.exit(1)
