"""The websocket ``/ws?clientId=``: status, execution events and binary previews, as ComfyUI sends them.

Each client (by ``clientId``, or a fresh id) has an ordered backlog; a sender task writes it
out and removes a message only once it was written, so a client that reconnects with the same
``clientId`` within ``resume_window`` seconds gets everything it missed. Events of a prompt go to
the client that submitted it (to every client when the prompt has no ``client_id``); ``status``
goes to everyone on every queue change. Previews are paced: a client with previews still
waiting to be sent gets no new ones (slow clients drop frames, never fall behind).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

from engine import events as ev
from engine.jobs.queue import JobQueue
from engine.jobs.records import JobEvent, Notice, QueueChanged
from engine.server.common import dumps, parse_json

log = logging.getLogger("loom.server.ws")
PREVIEW_IMAGE = 1  # ComfyUI's binary event type for preview images
IMAGE_FORMATS = {"JPEG": 1, "PNG": 2}
Message = str | bytes


@dataclass(eq=False)
class _Client:
    sid: str
    ws: web.WebSocketResponse | None = None
    backlog: deque[Message] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    previews_waiting: int = 0
    detached_at: float | None = None


def status_message(remaining: int, sid: str | None) -> str:
    data: dict[str, object] = {"status": {"exec_info": {"queue_remaining": remaining}}}
    if sid is not None:
        data["sid"] = sid
    return dumps({"type": "status", "data": data})


def event_message(event: ev.Event) -> Message:
    if isinstance(event, ev.PreviewFrame):
        kind = IMAGE_FORMATS.get(event.format.upper(), 1)
        return struct.pack(">II", PREVIEW_IMAGE, kind) + event.image
    return dumps({"type": event.type, "data": event.data()})


class WsHub:
    def __init__(
        self,
        queue: JobQueue,
        *,
        resume_window: float = 60.0,
        max_backlog: int = 5000,
        max_waiting_previews: int = 1,
    ) -> None:
        self.queue = queue
        self.resume_window = resume_window
        self.max_backlog = max_backlog
        self.max_waiting_previews = max_waiting_previews
        self._clients: dict[str, _Client] = {}
        self.dropped_previews = 0

    # --- the route ------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        sid = request.query.get("clientId") or uuid.uuid4().hex
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=1 << 20)
        await ws.prepare(request)
        client = self._clients.get(sid)
        if client is None:
            client = self._clients[sid] = _Client(sid)
        old, client.ws, client.detached_at = client.ws, ws, None
        if old is not None and not old.closed:
            await old.close(message=b"replaced by a new connection with the same clientId")
        remaining = await asyncio.to_thread(self.queue.remaining)  # a job-database read: off the loop
        await ws.send_str(status_message(remaining, sid))
        sender = asyncio.create_task(self._send_loop(client, ws))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._on_client_text(ws, msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
                # binary and anything else from the client: ignored
        finally:
            sender.cancel()
            if client.ws is ws:
                client.ws, client.detached_at = None, time.monotonic()
        return ws

    async def _on_client_text(self, ws: web.WebSocketResponse, text: str) -> None:
        """Unknown messages are ignored; ComfyUI's ``feature_flags`` hello gets our flags back."""
        try:
            data = parse_json(text)
        except (
            ValueError
        ):  # not JSON, non-finite numbers, nested too deeply: ignored like any unknown message
            return
        if isinstance(data, dict) and data.get("type") == "feature_flags":
            await ws.send_str(dumps({"type": "feature_flags", "data": {"supports_preview_metadata": False}}))

    async def _send_loop(self, client: _Client, ws: web.WebSocketResponse) -> None:
        while not ws.closed:
            if not client.backlog:
                client.wakeup.clear()
                await client.wakeup.wait()
                continue
            message = client.backlog[0]
            try:
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                else:
                    await ws.send_str(message)
            except (ConnectionResetError, RuntimeError):
                return
            if client.backlog and client.backlog[0] is message:
                client.backlog.popleft()
                if isinstance(message, bytes):
                    client.previews_waiting -= 1

    # --- the sink (on the event loop) -----------------------------------------------------------
    def __call__(self, notice: Notice) -> None:
        if isinstance(notice, QueueChanged):
            self._purge()
            for client in self._clients.values():
                if client.ws is not None:
                    self._enqueue(client, status_message(notice.remaining, client.sid))
        elif isinstance(notice, JobEvent):
            target = notice.spec.client_id
            if target:
                known = self._clients.get(target)
                if known is None:  # submitted before connecting: keep its events for a while
                    known = self._clients[target] = _Client(target, detached_at=time.monotonic())
                self._deliver(known, notice.event)
            else:
                for client in self._clients.values():
                    if client.ws is not None:
                        self._deliver(client, notice.event)

    def send_custom(self, event_type: str, data: object, sid: str | None = None) -> None:
        """A plugin's own message (``send_sync``): to one client, or to all when ``sid`` is None."""
        try:
            message = dumps({"type": event_type, "data": data})
        except (ValueError, RecursionError) as exc:  # a plugin's message that JSON cannot carry
            log.warning("dropped the plugin message %r: it cannot be sent as JSON (%s)", event_type, exc)
            return
        targets = (
            [self._clients[sid]]
            if sid is not None and sid in self._clients
            else ([] if sid is not None else [c for c in self._clients.values() if c.ws is not None])
        )
        for client in targets:
            self._enqueue(client, message)

    def _deliver(self, client: _Client, event: ev.Event) -> None:
        if isinstance(event, ev.PreviewFrame):
            if client.ws is None or client.previews_waiting >= self.max_waiting_previews:
                self.dropped_previews += 1
                return
            client.previews_waiting += 1
        self._enqueue(client, event_message(event))

    def _enqueue(self, client: _Client, message: Message) -> None:
        client.backlog.append(message)
        while len(client.backlog) > self.max_backlog:
            dropped = client.backlog.popleft()
            if isinstance(dropped, bytes):
                client.previews_waiting -= 1
        client.wakeup.set()

    def _purge(self) -> None:
        now = time.monotonic()
        gone = [
            sid
            for sid, c in self._clients.items()
            if c.ws is None and c.detached_at is not None and now - c.detached_at > self.resume_window
        ]
        for sid in gone:
            del self._clients[sid]

    async def close_all(self) -> None:
        for client in list(self._clients.values()):
            if client.ws is not None and not client.ws.closed:
                await client.ws.close(message=b"server shutting down")

    def connected(self) -> list[str]:
        return [sid for sid, c in self._clients.items() if c.ws is not None]
