"""Moving bytes both ways between two connected sockets until both sides are done.

Used for CONNECT tunnels, where the proxy must not look at the bytes (TLS end to end). Each
direction is its own task: an end-of-file from one side becomes a half-close (`SHUT_WR`) of
the other, so protocols that finish writing before they finish reading keep working. One
clock covers both directions: the tunnel ends when no byte moved either way for
``idle_timeout_s``, or when either side fails.

On Linux the bytes go socket -> pipe -> socket with `splice(2)` and never enter Python
(half the proxy's CPU of a recv/send copy, measured by ``scripts/bench-egress``); elsewhere
a reused buffer is received into and sent from.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable

_CHUNK_BYTES = 1 << 20
_SPLICE = getattr(os, "splice", None)

_Clock = list[float]


async def _ready(
    add: Callable[[int, Callable[[], None]], None], remove: Callable[[int], bool], fd: int
) -> None:
    """Wait until ``fd`` is readable (``add_reader``) or writable (``add_writer``)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    add(fd, wake)
    try:
        await future
    finally:
        remove(fd)


async def _pump_splice(src: socket.socket, dst: socket.socket, clock: _Clock) -> None:
    assert _SPLICE is not None
    loop = asyncio.get_running_loop()
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        import fcntl

        with contextlib.suppress(OSError):  # a bigger pipe means fewer round trips
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _CHUNK_BYTES)
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        src_fd, dst_fd = src.fileno(), dst.fileno()
        while True:
            try:
                pending = _SPLICE(src_fd, write_end, _CHUNK_BYTES, flags=flags)
            except BlockingIOError:
                await _ready(loop.add_reader, loop.remove_reader, src_fd)
                continue
            if pending == 0:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            clock[0] = loop.time()
            # Drain the pipe completely, so the next read has room for a whole chunk.
            while pending:
                try:
                    pending -= _SPLICE(read_end, dst_fd, pending, flags=flags)
                except BlockingIOError:
                    await _ready(loop.add_writer, loop.remove_writer, dst_fd)
            clock[0] = loop.time()
    finally:
        os.close(read_end)
        os.close(write_end)


async def _pump_copy(src: socket.socket, dst: socket.socket, clock: _Clock) -> None:
    loop = asyncio.get_running_loop()
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    while True:
        count = await loop.sock_recv_into(src, buffer)
        if count == 0:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        clock[0] = loop.time()
        await loop.sock_sendall(dst, view[:count])
        clock[0] = loop.time()


async def relay(client: socket.socket, upstream: socket.socket, *, idle_timeout_s: float) -> None:
    """Copy ``client`` <-> ``upstream`` until both directions ended, one failed, or idle.

    The caller owns (and closes) both sockets; this only reads, writes and half-closes.
    """
    loop = asyncio.get_running_loop()
    pump = _pump_splice if _SPLICE is not None else _pump_copy
    clock = [loop.time()]
    pumps = {
        asyncio.create_task(pump(client, upstream, clock)),
        asyncio.create_task(pump(upstream, client, clock)),
    }
    try:
        pending = pumps
        while pending:
            remaining = clock[0] + idle_timeout_s - loop.time()
            if remaining <= 0:
                return  # idle: the finally cancels whatever still runs
            done, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task.exception() is not None:
                    return  # a reset or broken pipe ends the tunnel both ways
    finally:
        for task in pumps:
            task.cancel()
        # Reaped here, so no pump outlives the sockets the caller is about to close.
        await asyncio.gather(*pumps, return_exceptions=True)
