"""Harness that runs pieces of the Python reference (Codename-11/hermes-relay)
against securelink, for `make interop REF=<checkout>`.

Nothing of the reference is copied here: its files are imported from the
checkout given with --ref at run time. This file only supplies what a
standalone run needs:

* a compatibility shim for older aiohttp releases (Debian 12 ships 3.8,
  the reference asks for >= 3.14): `web.AppKey` (added in 3.9) is provided
  as a plain string key when missing;
* `broker`: runs the reference rendezvous package's own command line
  (`python -m rendezvous ...`) with the arguments after `--`, with a trace
  on stderr of every `error` it sends (which function decided it) and of
  every host frame for a stream it no longer has, so a refusal can be
  explained;
* `connector`: starts the reference host connector with a trust store that
  holds the test broker's certificate, waits until it is registered,
  publishes one-use bootstrap credentials and writes them to 0600 files for
  securelink's client, then runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import runpy
import secrets
import signal
import ssl
import sys
import time
from pathlib import Path


def install_aiohttp_compat() -> str:
    """Fill in what newer aiohttp has and the reference uses at import time."""
    import aiohttp
    from aiohttp import web

    notes = []
    if not hasattr(web, "AppKey"):
        class AppKey(str):
            """Typed application key stand-in: an ordinary string key."""

            def __new__(cls, name, t=None):  # noqa: D401 - mirrors the newer signature
                return str.__new__(cls, name)

            def __class_getitem__(cls, item):
                return cls

        web.AppKey = AppKey
        notes.append("web.AppKey")
    return f"aiohttp {aiohttp.__version__}" + (f" (shimmed: {', '.join(notes)})" if notes else "")


def trace(msg: str) -> None:
    print(f"refshim-trace: {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def install_broker_trace() -> None:
    """Wrap two broker methods by name to log, then call the original."""
    from rendezvous import server as srv

    broker = srv.Broker
    orig_error = broker._error
    orig_host_binary = broker._host_binary

    async def error(ws, code):
        caller = sys._getframe(1).f_code.co_name
        trace(f"broker sends error {code!r} (decided in {caller})")
        return await orig_error(ws, code)

    async def host_binary(self, host, data):
        if len(data) >= 18:
            stream = host.streams.get(data[2:18])
            if stream is None or stream.closed:
                kind = {2: "DATA", 4: "CLOSE"}.get(data[1], f"flags={data[1]}")
                trace(f"host sent {kind} ({len(data) - 18} payload bytes) for a stream "
                      f"the broker has already closed")
        return await orig_host_binary(self, host, data)

    broker._error = staticmethod(error)
    broker._host_binary = host_binary


def run_broker(ref: Path, argv: list[str]) -> None:
    plugin = ref / "plugin"
    if not (plugin / "rendezvous" / "server.py").is_file():
        sys.exit(f"{plugin}/rendezvous/server.py not found: is --ref a hermes-relay checkout?")
    print(f"refshim: {install_aiohttp_compat()}", file=sys.stderr, flush=True)
    # The package `plugin` imports the whole Hermes plugin; the rendezvous
    # package stands alone, so import it as a top-level package.
    sys.path.insert(0, str(plugin))
    install_broker_trace()
    sys.argv = ["rendezvous", *argv]
    runpy.run_module("rendezvous", run_name="__main__", alter_sys=True)


def load_connector_module(ref: Path):
    path = ref / "plugin" / "relay" / "secure_link_connector.py"
    if not path.is_file():
        sys.exit(f"{path} not found: is --ref a hermes-relay checkout?")
    # Loaded by file: plugin/relay/__init__.py would start importing the
    # Relay server and its dependencies, which the connector does not need.
    spec = importlib.util.spec_from_file_location("ref_secure_link_connector", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def write_private(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
        fh.write("\n")
    os.replace(tmp, path)


async def run_connector(args: argparse.Namespace) -> int:
    print(f"refshim: {install_aiohttp_compat()}", file=sys.stderr, flush=True)
    import aiohttp

    mod = load_connector_module(Path(args.ref))
    token = Path(args.token_file).read_text(encoding="utf-8").strip()
    ctx = ssl.create_default_context(cafile=args.ca_file)

    def session_factory(**kw):
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx), **kw)

    conn = mod.SecureLinkConnector(
        broker_url=args.broker_url, host_id=args.host_id,
        host_registration_token=token, local_host="127.0.0.1",
        local_port=args.local_port, session_factory=session_factory,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await conn.start()
    deadline = time.monotonic() + args.timeout
    while conn.status().get("state") != "connected":
        if time.monotonic() > deadline:
            st = conn.status()
            print(f"refshim: connector not connected: state={st.get('state')} "
                  f"last_error={st.get('last_error')}", file=sys.stderr, flush=True)
            await conn.stop()
            return 1
        await asyncio.sleep(0.05)
    out_dir = Path(args.bootstrap_dir)
    for i in range(args.bootstraps):
        pairing_id = secrets.token_hex(8)
        expires = int(time.time()) + 600
        tok = await conn.publish_bootstrap(pairing_id=pairing_id, expires_at=expires)
        # The broker URL the client dials is the one the connector was given.
        write_private(out_dir / f"bootstrap-{i}.json", {
            "token": tok, "pairing_id": pairing_id, "expires_at": expires,
            "host_id": args.host_id, "broker_url": args.broker_url,
        })
    print(f"connected bootstraps={args.bootstraps}", flush=True)
    last = "connected"
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass
        st = conn.status()
        if st.get("state") != last:
            last = st.get("state")
            trace(f"connector state -> {last} (last_error={st.get('last_error')!r}, "
                  f"attempts={st.get('connect_attempts')})")
    st = conn.status()
    print(f"refshim: stopping; completed_streams={st.get('completed_streams')} "
          f"last_error={st.get('last_error')}", file=sys.stderr, flush=True)
    await conn.stop()
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("broker", help="run the reference broker; its own flags follow --")
    b.add_argument("--ref", required=True)
    b.add_argument("rest", nargs=argparse.REMAINDER)
    c = sub.add_parser("connector", help="run the reference host connector")
    c.add_argument("--ref", required=True)
    c.add_argument("--broker-url", required=True)
    c.add_argument("--host-id", required=True)
    c.add_argument("--token-file", required=True)
    c.add_argument("--ca-file", required=True)
    c.add_argument("--local-port", type=int, required=True)
    c.add_argument("--bootstrap-dir", required=True)
    c.add_argument("--bootstraps", type=int, default=1)
    c.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args()
    if a.cmd == "broker":
        rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
        run_broker(Path(a.ref), rest)
    else:
        sys.exit(asyncio.run(run_connector(a)))


if __name__ == "__main__":
    main()
