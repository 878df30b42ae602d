"""The serving side of the data plane: one ROUTER per worker proc, on its asyncio loop.

Async endpoints run as tasks on the loop; ``__init__``, ``on_restart`` and sync
endpoints run on the actor's own single thread (in arrival order), so the loop
keeps answering while an actor computes. Replies go to the caller's inbox
address (carried in each call) from whichever thread finished the call, on that
thread's own socket: a sync endpoint's reply never hops back through the loop. Every call, failed or not, can be
reported to a span sink (telemetry) without this module knowing about it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import zmq

from rlmesh.actor import debugger, hooks
from rlmesh.actor import protocol as P
from rlmesh.actor.client import ThreadSockets, error_payload
from rlmesh.actor.context import Context, ProcInfo, _current
from rlmesh.actor.dedup import CallIdWindow, Verdict
from rlmesh.transport.auth import AuthError, Authenticator
from rlmesh.transport.serialization import SerializationError, dumps, loads, nbytes
from rlmesh.transport.sockets import (MessageTooLarge, bind_channel, check_message_size, has_message, limit_messages,
                                      max_message_bytes, recv_frames, send_frames, tune, zmq_context)

logger = logging.getLogger(__name__)


@dataclass
class HostedActor:
    instance: Any
    ctx: Context
    executor: concurrent.futures.ThreadPoolExecutor
    endpoints: dict[str, Any] = field(default_factory=dict)
    is_async: dict[str, bool] = field(default_factory=dict)  # looked up once here, not on every call


class ActorServer:
    """Receives calls for the actors of this proc and sends the replies."""

    def __init__(self, auth: Authenticator, proc: ProcInfo, loop: asyncio.AbstractEventLoop):
        self.auth = auth
        self.proc = proc
        self.loop = loop
        self.actors: dict[str, HostedActor] = {}
        self.max_message = max_message_bytes()
        self.sock = limit_messages(tune(zmq_context().socket(zmq.ROUTER)))  # before any frame is buffered
        self.addr, self.chan = bind_channel(self.sock, auth, f"actor calls to {proc.proc_id}", local=True)
        self.call_ids = CallIdWindow()
        self.calls_served = 0
        self.bytes_received = 0
        self._reply_tls = threading.local()
        self._reply_lock = threading.Lock()
        self._reply_registry: list = []
        self._serving: set[asyncio.Task] = set()  # async endpoint calls in flight (cancelled at stop)
        # Small replies made on the loop's thread while other async calls are still running, per caller
        # inbox: sent as one message when the last of them finishes, or at the loop's next turn at the
        # latest (never on a timer). Why: a burst of pipelined calls is read in one drain and served in
        # one turn; a message per reply cost a send, a MAC and a wake-up each on both sides (issue 40).
        self._held: dict[str, list[tuple[int, str, bytes]]] = {}
        self._held_bytes = 0
        self._flush_soon = False
        self._loop_thread = threading.get_ident()  # built on the loop's thread (Worker.__init__)
        self._stopping = False
        loop.add_reader(self.sock.getsockopt(zmq.FD), self._drain)  # type: ignore[arg-type]  # zmq.FD is an int option

    # ------------------------------------------------------------------ actors
    def _run_in_actor(self, actor: HostedActor, fn: Any, *args: Any) -> asyncio.Future:
        ctx = contextvars.copy_context()
        ctx.run(_current.set, actor.ctx)
        return self.loop.run_in_executor(actor.executor, ctx.run, fn, *args)

    async def spawn(self, spec: dict, cls_payload: list[Any], restarted: bool) -> None:
        """Create one actor from its spec; run ``on_restart`` too when this is a replacement."""
        cls, args, kwargs = loads(cls_payload)
        ctx = Context(rank=spec["rank"], shape=spec["shape"], coords=spec["coords"],
                      mesh_name=spec["mesh"], actor_id=spec["actor_id"], proc=self.proc)
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"actor-{spec['actor_id']}")
        hosted = HostedActor(None, ctx, executor)
        hosted.instance = await self._run_in_actor(hosted, lambda: cls(*args, **kwargs))
        for name in spec["endpoints"]:
            fn = hosted.endpoints[name] = getattr(hosted.instance, name)
            hosted.is_async[name] = inspect.iscoroutinefunction(fn)
        if restarted:
            await self._invoke_hook(hosted, "on_restart")
        self.actors[spec["actor_id"]] = hosted

    async def _invoke_hook(self, hosted: HostedActor, name: str) -> None:
        fn = getattr(hosted.instance, name, None)
        if fn is None:
            return
        if inspect.iscoroutinefunction(fn):
            token = _current.set(hosted.ctx)
            try:
                await fn()
            finally:
                _current.reset(token)
        else:
            result = await self._run_in_actor(hosted, fn)
            if inspect.isawaitable(result):
                await result

    async def stop_actors(self) -> None:
        for hosted in list(self.actors.values()):
            try:
                await asyncio.wait_for(self._invoke_hook(hosted, "on_stop"), timeout=10)
            except Exception:
                logger.exception("on_stop of %s failed", hosted.ctx.actor_id)
            hosted.executor.shutdown(wait=False, cancel_futures=True)

    async def cancel_calls(self, timeout: float) -> int:
        """Cancel the async endpoint calls still in flight when the proc stops, and give their
        ``finally`` blocks up to ``timeout`` seconds; returns how many there were.

        Why: left pending, such a call was simply dropped at exit: its cleanup never ran, and if the
        garbage collector met its task first, asyncio logged "Task was destroyed but it is pending!"
        into the proc's logs (seen in a suite run). They send no reply: their callers learn of the
        stop from the proc's end (``ActorDied``), as for any call a stopping proc leaves unanswered.
        A call still running after ``timeout`` (a cleanup that hangs) is abandoned with the proc.
        When: after the actors' ``on_stop``, before the shutdown hooks (so rows that cleanup records
        are still shipped).
        """
        self._stopping = True
        pending = [t for t in self._serving if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
            for t in still:
                t._log_destroy_pending = False  # type: ignore[attr-defined]  # asyncio's own flag  # abandoned on purpose: the proc exits with it
                logger.warning("a call still ran %.0f s after the proc's stop cancelled it; abandoned", timeout)
        return len(pending)

    # ------------------------------------------------------------------ calls
    def _drain(self) -> None:
        """The loop's reader callback: its descriptor polled readable, so the first read goes straight to
        ``recv`` (a ``zmq.Again`` when only a command woke it, e.g. a caller connecting) instead of asking
        ``has_message`` first (1.35 µs a call); then read until ``has_message`` says empty, which is what
        re-arms the descriptor (it is edge-triggered)."""
        sock = self.sock
        first = True
        while first or has_message(sock):
            first = False
            try:
                frames = recv_frames(sock, zmq.NOBLOCK)
            except zmq.Again:
                break
            ident, body = frames[0], frames[1:]
            size = nbytes(body)
            self.bytes_received += size
            try:
                meta, payload = P.decode_meta(self.chan, body)
            except AuthError:
                continue  # counted, and logged at most once per peer per interval, by the channel
            except Exception as exc:
                logger.warning("dropped a malformed message: %s", exc)
                continue
            if meta[0] == P.CALLS:
                self._dispatch_calls(ident, meta, payload)
            else:
                self._dispatch(ident, meta, payload, size)

    def _dispatch_calls(self, ident: Any, meta: tuple, payload: list[Any]) -> None:
        """A caller's batch of calls (one turn of its event loop): each is dispatched as if it came alone."""
        try:
            calls = P.unpack_calls(payload)
        except Exception as exc:
            logger.warning("dropped a malformed batch of calls: %s", exc)
            return
        caller, inbox = meta[4], meta[5]
        for kind, call_id, actor_id, endpoint, head in calls:
            self._dispatch(ident, (kind, call_id, actor_id, endpoint, caller, inbox), [head], len(head))

    def _dispatch(self, ident: Any, meta: tuple, payload: list[Any], size_in: int) -> None:
        kind, call_id, actor_id, endpoint, caller, inbox = meta
        verdict = self.call_ids.admit(inbox, call_id)
        if verdict is Verdict.DUPLICATE:
            self.chan.log.replayed(caller, "call id served already")
            return
        call = _Served(call_id, inbox if kind == P.CALL else "", actor_id, endpoint, caller, time.time(), size_in)
        if verdict is Verdict.TOO_OLD:
            self.chan.log.replayed(caller, "call id older than the replay window")
            self._finish(call, self.actors.get(actor_id), exc=PermissionError(
                f"call id {call_id} is older than this server's replay window; not run"))
            return
        hosted = self.actors.get(actor_id)
        fn = None if hosted is None else hosted.endpoints.get(endpoint)
        if fn is None or hosted is None:  # hosted: for the checker (fn is None whenever it is)
            what = f"no actor {actor_id!r} in this proc" if hosted is None else f"no endpoint {endpoint!r}"
            self._finish(call, hosted, exc=LookupError(what))
            return
        try:
            args, kwargs = loads(payload)
        except Exception as exc:
            self._finish(call, hosted, exc=exc, tb=traceback.format_exc())
            return
        if hosted.is_async[endpoint]:
            token = _current.set(hosted.ctx)
            try:
                task = call.task = self.loop.create_task(self._serve_async(call, hosted, fn, args, kwargs))
            finally:
                _current.reset(token)
            self._serving.add(task)  # _serve_async takes it out (a done callback costs a loop iteration)
        else:
            ctx = contextvars.copy_context()
            ctx.run(_current.set, hosted.ctx)
            hosted.executor.submit(ctx.run, self._serve_sync, call, hosted, fn, args, kwargs)

    async def _serve_async(self, call: "_Served", hosted: HostedActor, fn: Any, args: tuple, kwargs: dict) -> None:
        try:
            result = await fn(*args, **kwargs)
        except GeneratorExit:
            # The coroutine is being closed with this proc's event loop: the proc is going away, and the
            # call has no answer. Its caller learns that from the proc's stop or death (ActorDied); a
            # reply here would race it and say "ActorError: GeneratorExit" instead (seen in a clean run).
            raise
        except BaseException as exc:  # noqa: BLE001 - everything else goes back to the caller
            if self._stopping and isinstance(exc, asyncio.CancelledError):
                raise  # cancelled by the proc's stop (cancel_calls): no answer, as for GeneratorExit above
            self._serving.discard(call.task)  # before _finish: it holds replies while other calls run
            if debugger.post_mortem_enabled():  # on the actor's thread: the proc's event loop goes on
                await self._run_in_actor(hosted, _post_mortem, exc)
            self._finish(call, hosted, exc=exc, tb="".join(traceback.format_exception(exc)))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return
        finally:
            self._serving.discard(call.task)  # set by _dispatch before this task's first step
        self._finish(call, hosted, result)

    def _serve_sync(self, call: "_Served", hosted: HostedActor, fn: Any, args: tuple, kwargs: dict) -> None:
        """Runs on the actor's thread: call, pickle the result and reply from here."""
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            if debugger.post_mortem_enabled():
                _post_mortem(exc)
            self._finish(call, hosted, exc=exc, tb="".join(traceback.format_exception(exc)))
            return
        self._finish(call, hosted, result)

    def _new_reply_bag(self) -> ThreadSockets:
        """This thread's first reply: its DEALERs to callers' inboxes, one per caller, made as it first replies."""
        bag = self._reply_tls.bag = ThreadSockets(self.auth, self._reply_lock, self._reply_registry)
        return bag

    def _finish(self, call: "_Served", hosted: HostedActor | None, result: Any = None,
                exc: BaseException | None = None, tb: str | None = None) -> None:
        """Send the reply, ``result`` or ``exc`` (if a reply is wanted), and report the span. Safe on any thread."""
        self.calls_served += 1
        out = 0
        frames: list[Any] | None = None  # the reply, when it goes as a message of its own
        if call.reply_to:
            reply: list[Any] = []
            if exc is None:
                try:
                    reply = dumps(result)
                except SerializationError as err:
                    exc, tb = SerializationError(f"the result of {call.endpoint} {err}"), None
            if exc is not None:
                reply = error_payload(exc, tb)
            on_loop = threading.get_ident() == self._loop_thread
            if len(reply) == 1 and on_loop and (out := nbytes(reply)) <= _HOLD_REPLY_BYTES:
                self._hold_reply(call.reply_to, call.call_id, P.OK if exc is None else P.ERR, bytes(reply[0]))
            else:
                frames = reply
                if self._held and on_loop:
                    self._flush_replies()  # what is held goes first, as it was made first
        if call.reply_to and frames is not None:
            try:
                bag = getattr(self._reply_tls, "bag", None) or self._new_reply_bag()
                sock, session = bag.get(call.reply_to)  # this thread's DEALER to the caller's inbox, and its session
                msg = P.encode(session, (call.call_id, P.OK if exc is None else P.ERR), frames)
                out = nbytes(msg)
                if out > self.max_message:  # the caller's inbox would drop it unread: say why instead
                    try:
                        check_message_size(msg, out, f"the result of {call.endpoint}")
                    except MessageTooLarge as big:
                        exc = big
                        msg = P.encode(session, (call.call_id, P.ERR), error_payload(big, None))
                        out = nbytes(msg)
                send_frames(sock, msg)
            except (zmq.ZMQError, AuthError) as err:
                logger.warning("could not reply to %s: %s", call.caller, err)
        elif exc is not None:
            logger.error("broadcast %s.%s failed:\n%s", call.actor_id, call.endpoint,
                         tb or f"{type(exc).__name__}: {exc}")
        sink = hooks.span_sink()
        if sink is not None:
            ctx = hosted.ctx if hosted is not None else None
            try:
                sink(hooks.Span(
                    mesh=ctx.mesh_name if ctx else "", actor_id=call.actor_id, rank=ctx.rank if ctx else -1,
                    endpoint=call.endpoint, caller=call.caller, start_ts=call.t0, duration_s=time.time() - call.t0,
                    outcome="ok" if exc is None else "error", bytes_in=call.size_in, bytes_out=out,
                    error="" if exc is None else f"{type(exc).__name__}: {exc}"))
            except Exception:
                logger.exception("span sink failed")

    def _hold_reply(self, reply_to: str, call_id: int, status: str, head: bytes) -> None:
        held = self._held.get(reply_to)
        if held is None:
            held = self._held[reply_to] = []
        held.append((call_id, status, head))
        self._held_bytes += len(head)
        if not self._serving or self._held_bytes >= _HOLD_REPLY_BYTES or len(held) >= _HOLD_REPLIES:
            self._flush_replies()  # no other async call left to wait for (a lone call_one: sent at once)
        elif not self._flush_soon:
            self._flush_soon = True
            self.loop.call_soon(self._flush_replies)  # at the loop's next turn, whatever still runs

    def _flush_replies(self) -> None:
        """Send the held replies: one message per caller inbox (a lone reply as an ordinary one)."""
        self._flush_soon = False
        held, self._held, self._held_bytes = self._held, {}, 0
        for reply_to, replies in held.items():
            try:
                bag = getattr(self._reply_tls, "bag", None) or self._new_reply_bag()
                sock, session = bag.get(reply_to)
                if len(replies) == 1:
                    call_id, status, head = replies[0]
                    msg = P.encode(session, (call_id, status), [head])
                else:
                    msg = P.encode(session, (0, P.BATCH), P.pack_replies(replies))
                send_frames(sock, msg)
            except (zmq.ZMQError, AuthError) as err:
                logger.warning("could not reply to %s: %s", reply_to, err)

    def close(self) -> None:
        if self._held:
            self._flush_replies()
        try:
            self.loop.remove_reader(self.sock.getsockopt(zmq.FD))  # type: ignore[arg-type]  # zmq.FD is an int option
        except Exception:
            pass
        self.sock.close(0)
        with self._reply_lock:
            socks = list(self._reply_registry)
        for s in socks:
            s.close(0)


_HOLD_REPLY_BYTES = 64 * 1024  # replies this small may wait for their batch; held ones go once this much is held
_HOLD_REPLIES = 256  # nor more than this many to one caller in one message


class _Served:
    """One call being served: where to reply, and what to report in its span. A slotted class, not a
    frozen dataclass: one is made per call, and a frozen dataclass's ``__init__`` costs ~5x more."""

    __slots__ = ("call_id", "reply_to", "actor_id", "endpoint", "caller", "t0", "size_in", "task")

    def __init__(self, call_id: int, reply_to: str, actor_id: str, endpoint: str, caller: str, t0: float,
                 size_in: int):
        self.call_id = call_id
        self.reply_to = reply_to  # the caller's inbox; "" for broadcasts
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.caller = caller
        self.t0 = t0
        self.size_in = size_in
        self.task: asyncio.Task | None = None  # an async endpoint's call: the task serving it


def _post_mortem(exc: BaseException) -> None:
    """``RLMESH_POST_MORTEM=1``: pause in pdb at the endpoint's exception; a failed session never hides the error."""
    try:
        debugger.post_mortem(exc)
    except Exception:  # noqa: BLE001
        logger.exception("post-mortem session failed; the endpoint's error goes to the caller")
