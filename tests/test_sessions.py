"""Many users on one app: sessions that cannot lose a running job, every job stopped between steps by
its session's Stop or its client leaving, an app that heals damaged folders and failed saves, and
bounded memory, files and request bodies. Handlers are called as plain functions; the last tests
run the app itself."""

import json
import math
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import tabs_of

from engine.prompts import Prompt
from workbench import exports, figures
from workbench.core import Workbench
from workbench.session import MAX_RUNS_IN_MEMORY, MAX_SESSIONS, RunState
from workbench.store import MAX_DOWNLOADS
from workbench.tabs.decode import TABLE_HEADERS


def wait_for(condition, what: str, limit_s: float = 120):
    """Poll until condition() holds; a bound on a hang, not a timing assertion."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def run_in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("result", fn(*args)))
    t.start()
    return t, out


# -- sessions that cannot lose a running job ---------------------------------------------------------
def test_a_running_session_survives_a_hundred_others_and_its_stop_still_works(wb, tabs):
    runner = wb.sessions.get("runner")
    t, out = run_in_thread(lambda: list(tabs.decode.decode(runner, "import os\n", "demo_tuned", "", max_new_tokens=1000)))
    wait_for(lambda: runner.run is not None and len(runner.run.traces) >= 3, "the run started")
    for i in range(100):  # each one touched, and each with a finished run of its own (runs are dropped from memory)
        other = wb.sessions.get(f"other-{i}")
        other.run = RunState({})
    assert "runner" in wb.sessions and runner.run is not None
    assert len(wb.sessions) <= MAX_SESSIONS + 1  # the idle ones were forgotten, the busy one kept
    assert sum(s.run is not None for s in (wb.sessions.get(f"other-{i}") for i in range(90, 100))) <= MAX_RUNS_IN_MEMORY
    wb.sessions.stop("runner")
    t.join(120)
    events = out["result"]
    assert events[-1]["done"] and "stopped by user" in events[-1]["stats"] and runner.run.tokens < 1000


def test_the_api_result_comes_from_its_own_run_whatever_the_table_does(wb, tabs):
    session = wb.sessions.get("api")
    t, out = run_in_thread(tabs.api.generate, session, "def read_config(path):", "demo_tuned", "medusa", "greedy", 0.7, 1.0,
                           None, 300)
    wait_for(lambda: session.run is not None and session.run.traces, "the API run started")
    for i in range(MAX_SESSIONS + 20):
        wb.sessions.get(f"crowd-{i}")
    t.join(120)
    res = out["result"]
    assert "error" not in res, res
    solo = wb.engine.generate("def read_config(path):", 300, mode="medusa", tree="demo_tuned")
    assert res["token_ids"] == solo.token_ids and res["finish_reason"] == solo.finish_reason


def test_a_client_that_goes_away_stops_its_run_and_is_forgotten(wb, tabs):
    session = wb.sessions.get("leaver")
    t, out = run_in_thread(lambda: list(tabs.decode.decode(session, "import os\n", "demo_tuned", "", max_new_tokens=1000)))
    wait_for(lambda: session.run is not None and len(session.run.traces) >= 3, "the run started")
    wb.sessions.close("leaver")
    t.join(120)
    assert session.run.finish == "user" and session.run.tokens < 1000
    assert "leaver" not in wb.sessions  # forgotten once its job ended
    idle = wb.sessions.get("idle")
    idle.run = session.run
    wb.sessions.close("idle")  # a stream that closes after its last event is not a client leaving
    assert wb.sessions.get("idle") is idle and idle.run is not None and not idle.stop.is_set()
    saved = next(r for r in wb.store.list_runs() if r["id"] == session.run.run_id)
    assert saved["finish"] == "user"


class StopAfter(threading.Event):
    """Stop pressed once the job has asked `n` times (between steps): deterministic, no clock."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.asked = n, 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > self.n or super().is_set()

    def clear(self) -> None:
        self.n = 10**9  # the job ended: later checks are a new job's


@pytest.fixture
def counted_steps(wb, monkeypatch):
    """How many decoding steps the engine ran."""
    count = {"steps": 0}
    real = wb.engine.stream

    def stream(*a, **k):
        for ev in real(*a, **k):
            count["steps"] += 1
            yield ev

    monkeypatch.setattr(wb.engine, "stream", stream)
    return count


JOBS = {  # every job that decodes, called on a session and prompts; -> its message
    "collect": lambda t, s, p: t.tune.collect(s, p, 200),
    "measure": lambda t, s, p: t.tune.measure_latency(s, "4,8", p, 200)[0],
    "confirm": lambda t, s, p: t.tune.confirm_tree(s, "[[0], [0, 0]]", p, 200),
    "compare": lambda t, s, p: t.compare.compare(s, "ar", "demo_tuned", "", p, 200, "greedy", 0.7, 0)[1],
    "rules": lambda t, s, p: t.compare.compare_rules(s, "demo_tuned", "", p, 0.7, 64)[1],
}


@pytest.mark.parametrize("job", JOBS)
def test_every_job_stops_between_steps(wb, tabs, counted_steps, job):
    session = wb.sessions.get(f"job-{job}")
    session.stop = StopAfter(12)  # Stop after the 12th check
    prompts = [Prompt(t, [t], i) for i, t in enumerate(["import os\n", "def main():\n", "class A:\n", "x = 1\n"])]
    msg = JOBS[job](tabs, session, prompts)
    assert "stopped by user" in msg, msg
    assert counted_steps["steps"] <= 13, counted_steps  # not the rest of a prompt, nor the rest of the job


@pytest.mark.parametrize("job", ["measure", "confirm", "compare", "rules", "collect"])
def test_a_prompt_too_long_for_the_context_is_a_message(wb, tabs, job):
    long = "x = 1\n" * 1000
    msg = JOBS[job](tabs, wb.sessions.get(f"long-{job}"), [Prompt(long, [long], "long")])
    assert msg.startswith("✗") and "exceeds the context" in msg, msg


# -- the UI's step index, damaged folders, failed saves, downloads --------------------------------
@pytest.fixture(scope="module")
def decoded(wb, tabs):
    session = wb.sessions.get("decoded")
    events = list(tabs.decode.decode(session, "def main():\n", "demo_tuned", "", max_new_tokens=24))
    assert events[-1]["done"]
    return session


@pytest.mark.parametrize("step", [math.nan, math.inf, -math.inf, "abc", None, True, [1]])
def test_a_step_that_is_not_a_number_shows_nothing_and_raises_nothing(tabs, decoded, step):
    assert tabs.decode.select(decoded, step, figures.TreeView()) is None
    assert tabs.decode.step_view(decoded, step) == (None, None, [])


def test_steps_out_of_range_are_clamped(tabs, decoded):
    n = len(decoded.run.traces)
    assert tabs.decode.select(decoded, -5, figures.TreeView())[5] == 0
    assert tabs.decode.select(decoded, 1e9, figures.TreeView())[5] == n - 1


def test_damaged_run_folders_are_skipped_and_named(tmp_path, demo_engine):
    wb = Workbench(demo_engine, tmp_path)
    tabs = tabs_of(wb)
    session = wb.sessions.get("s")
    list(tabs.decode.decode(session, "def main():\n", "demo_tuned", "", max_new_tokens=8))
    good = session.run.run_id
    for name, text in (("20990101-000000-aaaaaa", "{not json"), ("20990101-000000-bbbbbb", "[1, 2]"),
                       ("20990101-000000-cccccc", json.dumps({"id": "20990101-000000-cccccc", "settings": "x"}))):
        (wb.store.runs_dir / name).mkdir()
        (wb.store.runs_dir / name / "settings.json").write_text(text)
    os.mkfifo(wb.store.runs_dir / "20990101-000000-cccccc" / "trace.jsonl")
    assert [r[1] for r in tabs.decode.run_choices()] == [good]
    assert "3 damaged run folder(s) skipped" in tabs.decode.runs_note()
    assert tabs.decode.load_run(session, "20990101-000000-cccccc").startswith("✗")
    from workbench.app import build_app

    build_app(wb)  # the app starts: one bad folder once stopped it


def test_a_failed_save_is_a_message_and_leaves_no_folder(tmp_path, demo_engine, monkeypatch):
    wb = Workbench(demo_engine, tmp_path)
    tabs = tabs_of(wb)

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wb.store, "_write", full_disk)
    res = tabs.api.generate(wb.sessions.get("s"), "def main():\n", max_new_tokens=8)
    assert len(res["token_ids"]) == 8 and res["run_id"] is None  # the run itself is whole
    assert "not saved: could not save the run (No space left on device)" in res["stats"]
    assert list(wb.store.runs_dir.iterdir()) == [] and list(wb.store.staging.iterdir()) == []


def test_downloads_are_bounded_and_leave_nothing_in_tmp(tmp_path, demo_engine, decoded, tabs):
    import tempfile

    wb = Workbench(demo_engine, tmp_path)
    before = set(Path(tempfile.gettempdir()).glob("mwb-*"))
    _, _, table = tabs.decode.step_view(decoded, 0)
    for _ in range(MAX_DOWNLOADS + 8):
        csv_text = exports.table_csv(TABLE_HEADERS, exports.table_rows(table))
        assert wb.store.write_download("nodes.csv", csv_text).read_text().startswith("node,path,token")
    figs = tabs.decode.run_figures(decoded)
    files = [wb.store.write_download(f"{i}.html", exports.figure_html(f)) for i, f in enumerate(figs) if f is not None]
    assert len(files) == 3 and all(Path(f).is_relative_to(wb.store.downloads_dir) for f in files)
    assert set(Path(tempfile.gettempdir()).glob("mwb-*")) == before
    assert len(list(wb.store.downloads_dir.iterdir())) == MAX_DOWNLOADS
    Workbench(demo_engine, tmp_path)  # a restart empties the folder
    assert list(wb.store.downloads_dir.iterdir()) == []


def test_a_fifo_planted_in_the_pools_is_refused(wb, tabs):
    os.mkfifo(wb.store.pools_dir / "planted.jsonl")
    msg = tabs.tune.use_pool(wb.sessions.get("pools"), "planted")
    assert msg.startswith("✗") and "not a regular file" in msg


# -- the app itself: request bodies, and a client that goes away ----------------------------------
@pytest.fixture(scope="module")
def live(wb):
    from workbench.app import serve

    app, url = serve(wb, block=False)
    yield url
    app.close()


def test_request_bodies_are_bounded_before_they_are_read(live):
    import httpx

    from workbench.app import MAX_REQUEST

    big = b'{"data": ["' + b"x" * (MAX_REQUEST + 1000) + b'"], "fn_index": 0, "session_hash": "big"}'
    assert httpx.post(f"{live}gradio_api/queue/join", content=big, headers={"content-type": "application/json"},
                      timeout=60).status_code == 413

    def chunks():  # no content-length: counted as it arrives
        for _ in range(40):
            yield b"x" * 100_000

    assert httpx.post(f"{live}gradio_api/queue/join", content=chunks(), timeout=60).status_code == 413
    small = httpx.post(f"{live}gradio_api/queue/join", json={"data": [], "fn_index": 10**6, "session_hash": "s"})
    assert small.status_code != 413


def test_a_dropped_api_client_stops_its_run(wb, live, tmp_path):
    """A gradio_client process killed mid-run: its /generate ends at the next step, not after 1,000 tokens."""
    import signal

    from workbench.loadtest import start_dropped_client

    before = {r["id"] for r in wb.store.list_runs()}
    p = start_dropped_client(live, 1000, tmp_path / "client.log")  # once its stream has heard that the run runs
    try:
        wait_for(lambda: any(s.run is not None and len(s.run.traces) >= 3 for s in wb.sessions.running()),
                 "the client's run started")
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        p.kill()
    wait_for(lambda: {r["id"] for r in wb.store.list_runs()} - before, "the run ended and was saved")
    new = [r for r in wb.store.list_runs() if r["id"] not in before]
    assert new[0]["finish"] == "user" and new[0]["tokens"] < 1000, new[0]
    assert not wb.sessions.running()
