"""The agent endpoint: vLLM's own OpenAI-compatible app (its FastAPI routes, chat templates, tool-call and reasoning
parsers) over a ``sample`` callable instead of an engine (``easyrl.trainer.agent_endpoint.engine``), served by
uvicorn in a background thread of the calling process, with per-session attribution and token-exact capture.

Each agent session gets its own ``base_url`` (``http://host:port/sessions/<id>/v1``; the session id also works as the
API key on the plain ``http://host:port/v1``); every request it makes is recorded (:class:`Session.records`) with
the prompt ids as vLLM's renderer rendered them and the ids and log-probs the engine sampled, and
:meth:`Session.segments` assembles them into trajectory segments (``easyrl.agents.segments``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import re
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import unquote

from easyrl.agents.segments import RequestRecord, Segment, assemble_segments
from easyrl.quiet import root_levels_kept
from easyrl.trainer.agent_endpoint.engine import CURRENT_ROUTE, CURRENT_SESSION, Sample

__all__ = ["AgentEndpoint", "Session"]

_PREFIX = "/sessions/"
_SESSION_ID = re.compile(r"[A-Za-z0-9._~-]+")


@dataclass
class Session:
    """One agent session (one trajectory's requests): ``id``; ``data``, what the caller attached (e.g. the task row,
    read by ``sample``); ``root_url`` (``http://host:port/sessions/<id>``: the Anthropic SDK's ``base_url``),
    ``base_url`` / ``api_key`` for the agent's OpenAI client; ``records``, its served requests in order of arrival;
    ``errors``, its HTTP answers of status 400 and above (``errors_by_status`` by status)."""

    id: str
    root_url: str
    data: Any = None
    records: list[RequestRecord] = field(default_factory=list)
    errors: int = 0
    errors_by_status: collections.Counter = field(default_factory=collections.Counter)
    closed: bool = False

    @property
    def base_url(self) -> str:
        """``root_url + "/v1"``: the OpenAI SDK's ``base_url``."""
        return self.root_url + "/v1"

    @property
    def api_key(self) -> str:
        """The session id: an API key that attributes requests sent to the endpoint's plain ``/v1``."""
        return self.id

    def segments(self) -> list[Segment]:
        """:func:`easyrl.agents.segments.assemble_segments` of :attr:`records`."""
        return assemble_segments(list(self.records))


class AgentEndpoint:
    """vLLM's OpenAI server for ``model`` (a Hugging Face folder or name: its config, tokenizer and chat template;
    no weights are loaded) whose generation is ``sample`` (``easyrl.trainer.agent_endpoint.engine.Sample``).

    ``served_model_name``: the model name clients send (default ``model``); ``tool_call_parser`` /
    ``reasoning_parser``: vLLM's parser names (e.g. ``"hermes"`` for Qwen2.5, ``"deepseek_r1"``), the tool parser
    enabling ``tool_choice="auto"``; ``chat_template``: a template file or string replacing the tokenizer's;
    ``max_model_len``: the context (prompt + response tokens) the engine serves (default the model's);
    ``server_args``: further ``vllm serve`` arguments (e.g. ``["--default-chat-template-kwargs",
    '{"enable_thinking": false}']``). Binds ``host`` on ``port`` (0: a free one) at :meth:`start`; URLs name
    ``advertise`` (default ``host``, or this machine's host name when ``host`` is ``0.0.0.0``: for agents on other
    machines or in containers).

    Routes: vLLM's (``/v1/chat/completions`` with tools and streaming, ``/v1/completions``, ``/v1/models``,
    ``/v1/messages`` (Anthropic), ``/v1/responses``, ``/tokenize``, ...), under each session's prefix too. Requests
    that generate need an open session (else HTTP 400); a path under ``/sessions/<id>/`` of no open session gets
    HTTP 404. Every answer of status 400 and above is counted (``errors_by_status``, and per session)."""

    def __init__(self, model: str, sample: Sample, *, served_model_name: Optional[str] = None,
                 tool_call_parser: Optional[str] = None, reasoning_parser: Optional[str] = None,
                 chat_template: Optional[str] = None, max_model_len: Optional[int] = None,
                 trust_remote_code: bool = False, server_args: tuple[str, ...] = (),
                 host: str = "127.0.0.1", port: int = 0, advertise: Optional[str] = None):
        self.model = model
        self.sample = sample
        self.served_model_name = served_model_name or model
        self.host, self.port = host, port
        self.advertise = advertise or (socket.gethostname() if host in ("0.0.0.0", "") else host)
        argv = ["--model", model, "--served-model-name", self.served_model_name, "--disable-log-stats",
                "--disable-uvicorn-access-log"]
        if tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
        if reasoning_parser:
            argv += ["--reasoning-parser", reasoning_parser]
        if chat_template:
            argv += ["--chat-template", chat_template]
        if max_model_len:
            argv += ["--max-model-len", str(max_model_len)]
        if trust_remote_code:
            argv += ["--trust-remote-code"]
        self.argv = argv + list(server_args)
        self.engine: Any = None
        self.errors_by_status: collections.Counter = collections.Counter()
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self._url: Optional[str] = None

    # ---------------------------------------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        """``http://host:port`` of the running server. Raises ``RuntimeError`` before :meth:`start`."""
        if self._url is None:
            raise RuntimeError("the agent endpoint is not started: call start() first")
        return self._url

    def start(self, timeout: float = 120.0) -> str:
        """Build vLLM's app and serve it in a background thread; returns its base URL ``http://host:port``
        (OpenAI clients take ``base_url + "/v1"``, or a session's :attr:`Session.base_url`). Raises what vLLM
        raises on bad arguments or model files (``ValueError``, ``OSError``), ``RuntimeError`` when the server did
        not come up within ``timeout`` seconds."""
        if self._thread is not None:
            return self.url
        from easyrl.workers import vllm_compat

        with root_levels_kept():  # vLLM 0.23's api_server imports model_hosting_container_standards here
            make_arg_parser, validate_args, build_app, init_app_state = vllm_compat.openai_serving_api()
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(self.argv)
        validate_args(args)
        vllm_config = _frontend_config(args)
        from easyrl.trainer.agent_endpoint.engine import SampleEngineClient

        self.engine = SampleEngineClient(vllm_config, self.sample, self._record)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        port = sock.getsockname()[1]
        ready, failure = threading.Event(), []

        async def serve() -> None:
            import uvicorn

            with root_levels_kept():
                app = build_app(args, ("generate",))
                await init_app_state(self.engine, app.state, args, ("generate",))
            config = uvicorn.Config(_SessionRouter(app, self), lifespan="off", log_level="warning",
                                    access_log=False, timeout_graceful_shutdown=2)
            server = uvicorn.Server(config)
            app.state.server = server  # vLLM's engine-error handler reads it
            self._server = server
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
            ready.set()
            await task

        def run() -> None:
            try:
                asyncio.run(serve())
            except BaseException as err:  # raised by start when it happens before the server is up
                failure.append(err)
            finally:
                ready.set()
                sock.close()

        self._thread = threading.Thread(target=run, name="easyrl-agent-endpoint", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure or not (self._server and self._server.started):
            self.stop()
            if failure:
                raise failure[0]
            raise RuntimeError(f"the agent endpoint did not start within {timeout:.0f} s")
        self._url = f"http://{self.advertise}:{port}"
        return self._url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (requests in flight are cut) and join its thread; idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = self._server = self._url = None

    # ----------------------------------------------------------------------------------------------- sessions
    def open_session(self, session_id: Optional[str] = None, data: Any = None) -> Session:
        """A new session (``session_id``, or a fresh one) for one agent run; ``data`` is handed to ``sample`` with
        it. Raises ``ValueError`` for an id already open or not made of letters, digits and ``._~-`` (it goes into
        URLs), ``RuntimeError`` before :meth:`start`."""
        sid = session_id or f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        if not _SESSION_ID.fullmatch(sid):
            raise ValueError(f"a session id is made of letters, digits and ._~- only: {sid!r}")
        with self._lock:
            if sid in self._sessions:
                raise ValueError(f"session {sid!r} is already open")
            session = Session(sid, f"{self.url}{_PREFIX}{sid}", data)
            self._sessions[sid] = session
        return session

    def close_session(self, session: Session | str) -> Session:
        """Close a session: its later requests get HTTP 404, and a request still being sampled is not recorded.
        Returns it (its :attr:`Session.records` final). Raises ``KeyError`` for a session not open."""
        sid = session if isinstance(session, str) else session.id
        with self._lock:
            closed = self._sessions.pop(sid)
            closed.closed = True
        return closed

    def session(self, session_id: str) -> Optional[Session]:
        """The open session ``session_id``, or None."""
        with self._lock:
            return self._sessions.get(session_id)

    def _record(self, session: Session, record: RequestRecord) -> None:
        with self._lock:
            if session.closed:
                return
            record.index = len(session.records)
            session.records.append(record)

    def _count_error(self, session: Optional[Session], status: int) -> None:
        with self._lock:
            self.errors_by_status[status] += 1
            if session is not None:
                session.errors += 1
                session.errors_by_status[status] += 1

    # ------------------------------------------------------------------------------------------------- counts
    def counts(self) -> dict[str, int]:
        """The endpoint's counters since :meth:`start`: ``requests`` served, ``aborted`` (the client left first),
        ``failed`` (``sample`` raised), ``refused`` (unservable: n > 1, prompt log-probs, images, no session),
        ``http_errors`` (answers of status 400 and above, all causes), ``sessions_open``."""
        engine = self.engine
        with self._lock:
            return {"requests": engine.requests if engine else 0, "aborted": engine.aborted if engine else 0,
                    "failed": engine.failed if engine else 0, "refused": engine.refused if engine else 0,
                    "http_errors": sum(self.errors_by_status.values()), "sessions_open": len(self._sessions)}


class _SessionRouter:
    """ASGI layer before vLLM's app: takes the session from the ``/sessions/<id>`` prefix (stripped) or from the
    ``Authorization: Bearer <id>`` key, sets :data:`CURRENT_SESSION` / :data:`CURRENT_ROUTE` for the engine,
    answers 404 for a prefix of no open session, and counts every answer of status 400 and above."""

    def __init__(self, app: Any, endpoint: AgentEndpoint):
        self.app = app
        self.endpoint = endpoint

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, session = scope["path"], None
        if path.startswith(_PREFIX):
            sid, _, rest = path[len(_PREFIX):].partition("/")
            session = self.endpoint.session(unquote(sid))
            if session is None:
                self.endpoint._count_error(None, 404)
                await _error(send, 404, "NotFoundError", f"no open agent session {unquote(sid)!r}")
                return
            path = "/" + rest
            scope = dict(scope, path=path, raw_path=path.encode())
        else:
            key = _bearer(scope)
            session = self.endpoint.session(key) if key else None
        status: list[int] = []

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        tokens = CURRENT_SESSION.set(session), CURRENT_ROUTE.set(path)
        try:
            await self.app(scope, receive, send_status)
        finally:
            CURRENT_SESSION.reset(tokens[0])
            CURRENT_ROUTE.reset(tokens[1])
            if status and status[0] >= 400:
                self.endpoint._count_error(session, status[0])


def _bearer(scope: dict) -> Optional[str]:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            return text[7:].strip() if text.lower().startswith("bearer ") else None
    return None


async def _error(send: Any, code: int, kind: str, message: str) -> None:
    """An OpenAI-style error answer (vLLM's ``ErrorResponse`` shape)."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _frontend_config(args: Any) -> Any:
    """The ``VllmConfig`` of vLLM's front end for ``args`` without an engine, as vLLM's render-only server builds it
    (``vllm.entrypoints.launchers.render.entry``): the model config (no quantization: no kernels run here) and
    the structured-outputs config with the reasoning parser merged in (``EngineArgs.create_structured_outputs_
    config`` in 0.32, inside ``create_engine_config`` in 0.23: done here alike)."""
    from vllm import AsyncEngineArgs
    from vllm.config import VllmConfig

    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    structured = engine_args.structured_outputs_config
    if engine_args.reasoning_parser:
        structured.reasoning_parser = engine_args.reasoning_parser
    if getattr(engine_args, "reasoning_parser_plugin", None):
        structured.reasoning_parser_plugin = engine_args.reasoning_parser_plugin
    return VllmConfig(model_config=model_config, structured_outputs_config=structured)
