"""Recovery at any moment: each case runs a recipe as a user does (``rlmesh run`` in a subprocess)
and SIGKILLs a random proc of a random role twice: once at a random moment of its start (the
interpreter starting, joining, or its actor's ``__init__``, which for the trainer includes the first
weight publish), and once at a random moment of training (the built-in fault injection). Then:

- the run finishes (exit 0),
- ``work_items`` shows nothing lost and nothing counted twice (``WORK_ACCOUNT_SQL``),
- no process of the run survives 2 s after the controller exits,
- /dev/shm holds no segment of the run (names carry the job id: ``rlmesh-w-<job>-...``).

Seeds pick the victims and moments; the budgets are tiny (a few seconds of training each)."""

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
RLMESH = [sys.executable, "-m", "rlmesh.cli", "run"]
SHM = Path(os.environ.get("RLMESH_SHM_DIR", "/dev/shm"))

PPO = ["recipe=ppo_cartpole", "generator.replicas=2", "generator.num_envs=4", "generator.num_steps=32",
       "trainer.total_steps=20000", "trainer.update_epochs=2", "trainer.num_minibatches=2", "eval.every=0",
       "eval.episodes=2", "eval.target=null", "telemetry.health_interval_s=0", "run.progress=false"]
GRPO = ["recipe=grpo_addition", "buffer=on_policy", "steps=36", "prompts_per_step=4", "generator.samples_per_prompt=4",
        "trainer.sft_steps=5", "trainer.max_groups=null", "eval.every=0", "eval.episodes=8", "model.d_model=32",
        "model.n_layers=1", "model.n_heads=2", "telemetry.health_interval_s=0", "run.progress=false",
        "generator.replicas=1", "reward.replicas=1"]
RECIPES = {"ppo": (PPO, {"buffer": [0], "trainer": [1], "generator": [2, 3]}),
           "grpo": (GRPO, {"buffer": [0], "trainer": [1], "reward": [2], "generator": [3]})}
SEEDS = (1, 2)


class ProcWatch(threading.Thread):
    """Records every descendant of the run, and SIGKILLs proc ``rl.<rank>``'s first incarnation
    ``delay`` seconds after it appears (its start: interpreter, imports, join, actor ``__init__``)."""

    def __init__(self, root: int, rank: int, delay: float):
        super().__init__(daemon=True)
        self.root, self.rank, self.delay = root, rank, delay
        self.seen: dict[int, float] = {}  # pid -> create_time (a reused pid is another process)
        self.killed: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        marker = f"--proc-id rl.{self.rank} "
        name = f"rl.{self.rank}/0"  # a proc forked from the start-up template keeps the template's cmdline
        found_at = None
        while not self.stop.is_set():
            try:
                kids = psutil.Process(self.root).children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for p in kids:
                try:
                    self.seen.setdefault(p.pid, p.create_time())
                    cmd = " ".join(p.cmdline()) + " "
                except psutil.NoSuchProcess:
                    continue
                try:
                    named = p.name() == name
                except psutil.NoSuchProcess:
                    continue
                if self.killed is None and (named or (marker in cmd and "--incarnation 0 " in cmd)):
                    found_at = found_at or time.monotonic()
                    if time.monotonic() - found_at >= self.delay:
                        os.kill(p.pid, signal.SIGKILL)
                        self.killed = p.pid
            time.sleep(0.01)

    def survivors(self) -> list[int]:
        alive = []
        for pid, created in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive


def shm_of(job: str) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"rlmesh-w-{job}-*")) if SHM.is_dir() else []


def account(run_dir: Path) -> dict[str, int]:
    from rlmesh.rl.run.report import WORK_ACCOUNT_SQL

    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        cur = con.execute(WORK_ACCOUNT_SQL)
        return dict(zip([d[0] for d in cur.description], cur.fetchone()))


def injected(run_dir: Path) -> int:
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        return con.execute("SELECT count(*) FROM actors WHERE event = 'fault_injected'").fetchone()[0]


def deaths(run_dir: Path) -> list[tuple]:
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        return con.execute("SELECT mesh, rank, incarnation, signal, reason FROM actors WHERE event = 'died'").fetchall()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_proc_killed_at_a_random_moment_loses_nothing_and_leaves_nothing(tmp_path, recipe, seed):
    args, roles = RECIPES[recipe]
    rng = random.Random(f"{recipe}-{seed}")
    spawn_role = rng.choice(sorted(roles))
    # A proc forked from the warm template starts in 0.1-0.5 s on a quiet host, and a quiet host trains
    # these budgets in 1.5 s (GRPO) to 3 s (PPO): both moments are drawn from what even the fastest run goes through
    # (a training fault that finds its role restarting tries again 0.3 s later).
    spawn_rank, spawn_delay = rng.choice(roles[spawn_role]), rng.uniform(0.0, 0.6)
    run_role, run_after = rng.choice(sorted(roles)), rng.uniform(0.1, 0.6)
    job = f"chaos{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_RUNS_DIR")}
    env.update(PYTHONPATH=str(ROOT), RLMESH_JOB_ID=job)
    overrides = [f"faults.kill={run_role}", f"faults.start_after_s={run_after:.2f}", "faults.max_faults=1", "faults.every_s=0.3",
                 f"faults.seed={seed}", "run.max_restarts=-1"]
    what = (f"{recipe} seed {seed}: {spawn_role} rl.{spawn_rank} killed {spawn_delay:.2f}s into its start, "
            f"a {run_role} killed {run_after:.2f}s into training")
    proc = subprocess.Popen(RLMESH + args + overrides, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    watch = ProcWatch(proc.pid, spawn_rank, spawn_delay)
    watch.start()
    try:
        _, err = proc.communicate(timeout=360)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    exited = time.monotonic()
    watch.stop.set()
    watch.join(5)
    assert proc.returncode == 0, f"{what}\n{err[-4000:]}"
    assert watch.killed is not None, f"{what}: the victim never appeared"
    while watch.survivors() and time.monotonic() - exited < 2.0:
        time.sleep(0.05)
    assert not watch.survivors(), f"{what}: processes outlived the controller by 2 s: {watch.survivors()}"
    (run_dir,) = sorted({p.parent for p in (tmp_path / "runs").glob("2*/telemetry.duckdb")})
    acc = account(run_dir)
    assert acc["issued"] > 0 and acc["lost"] == 0 and acc["counted_twice"] == 0, (what, acc)
    died = deaths(run_dir)
    assert any(r == spawn_rank and inc == 0 and sig == signal.SIGKILL for _, r, inc, sig, _ in died), (what, died)
    assert injected(run_dir) == 1, f"{what}: the fault in training was not injected"
    assert not shm_of(job), f"{what}: shared memory left behind: {shm_of(job)}"
