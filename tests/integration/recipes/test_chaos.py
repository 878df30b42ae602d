"""Chaos tests: the recipes run as a user runs them (``rlmesh run`` in a subprocess) while real procs
are SIGKILLed or hung by the built-in fault injection, and the run's telemetry database must prove
the invariants of docs/faults.md: every issued work id accounted for exactly once (none lost, none
counted twice), versions never going down, the trainer resuming from its checkpoint, recovery
times recorded, and a controller killed with SIGKILL continued by ``resume=latest``."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
RLMESH = [sys.executable, "-m", "rlmesh.cli", "run"]

# ~5-10 s of training on 2 cores: long enough for a few injected faults, short for the suite.
PPO = ["recipe=ppo_cartpole", "generator.replicas=2", "generator.num_envs=4", "generator.num_steps=32",
       "trainer.total_steps=40000", "trainer.update_epochs=2", "trainer.num_minibatches=2", "eval.every=0",
       "eval.episodes=3", "eval.target=null", "telemetry.health_interval_s=0", "run.progress=false",
       "run.max_restarts=-1"]
GRPO = ["recipe=grpo_addition", "buffer=on_policy", "prompts_per_step=8", "generator.samples_per_prompt=4",
        "trainer.sft_steps=5", "trainer.max_groups=null", "eval.every=0", "eval.episodes=10", "model.d_model=32",
        "model.n_layers=1", "model.n_heads=2", "telemetry.health_interval_s=0", "run.progress=false",
        "generator.replicas=2", "reward.replicas=2", "run.max_restarts=-1"]


def env_for(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def run(args: list[str], cwd: Path, timeout: float = 150, env: dict[str, str] | None = None):
    """``rlmesh run`` to its end; past ``timeout``, a failure that shows where every controller
    thread was (SIGABRT with faulthandler on prints them) instead of a bare timeout."""
    proc = subprocess.Popen(args, cwd=cwd, env={**env_for(env), "PYTHONFAULTHANDLER": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"rlmesh run did not finish in {timeout} s; its threads at SIGABRT:\n{err[-12000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def only_run(cwd: Path) -> Path:
    (db,) = sorted({p.parent.resolve() for p in (cwd / "runs").glob("2*/telemetry.duckdb")})
    return db


def q(run_dir: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def account(run_dir: Path) -> dict[str, int]:
    from rlmesh.rl.run.report import WORK_ACCOUNT_SQL

    with duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True) as con:
        cur = con.execute(WORK_ACCOUNT_SQL)
        return dict(zip([d[0] for d in cur.description], cur.fetchone()))


def assert_invariants(run_dir: Path) -> dict[str, int]:
    """What must hold after any fault: nothing lost, nothing twice, versions and steps in order."""
    acc = account(run_dir)
    assert acc["issued"] > 0 and acc["lost"] == 0 and acc["counted_twice"] == 0, acc
    assert acc["consumed"] + acc["dropped"] + acc["abandoned"] + acc["unused"] == acc["issued"], acc
    rows, distinct = q(run_dir, "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")[0]
    assert rows == distinct                                     # no rollout counted twice
    # published versions only go up, across trainer restarts and resumes
    versions = [v for (v,) in q(run_dir, "SELECT policy_version FROM train_steps ORDER BY ts")]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    # no generator proc (any incarnation: a replacement pulls the newest) ever loaded a version older
    # than one it had loaded before
    back = q(run_dir, """SELECT count(*) FROM (
        SELECT version < max(version) OVER (PARTITION BY proc ORDER BY ts ROWS BETWEEN UNBOUNDED PRECEDING
                                            AND 1 PRECEDING) AS older
        FROM weight_syncs WHERE ok) WHERE older""")
    assert back == [(0,)]
    return acc


@pytest.mark.timeout(240)
def test_generators_killed_every_second_lose_nothing(tmp_path):
    out = run(RLMESH + PPO + ["faults.kill=generator", "faults.every_s=1", "faults.start_after_s=1",
                              "faults.max_faults=3", "faults.seed=2", "trainer.total_steps=80000"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    acc = assert_invariants(db)
    kills = q(db, "SELECT count(*) FROM actors WHERE event = 'fault_injected' AND reason = 'kill'")[0][0]
    restarts = q(db, "SELECT count(*), max(serving_s), min(serving_s) FROM actors WHERE event = 'restarted'")[0]
    # (the last kill may land as the run ends, before its replacement joins)
    assert kills >= 2 and kills - 1 <= restarts[0] <= kills and 0 < restarts[2] <= restarts[1] < 30, (kills, restarts)
    # recovery_s runs from the kill to the replacement's first progress, here its first rollout: never
    # less than the time to that rollout's row (serving alone used to count as recovered)
    recovered = q(db, PROGRESS_AFTER_RESTART.format(progress="rollouts o WHERE o.proc = r.proc AND"))
    assert restarts[0] - 1 <= len(recovered) <= restarts[0], (restarts, recovered)
    assert all(reason == "rollout landed" and rec > serving
               and (rec >= first - fault - 1e-3 if first is not None else died is not None and died < ROWS_LOST_S)
               for rec, serving, reason, fault, first, died in recovered), recovered
    assert acc["reissued"] >= 1                                 # a kill mid-rollout re-issued its item
    reasons = q(db, "SELECT reason FROM work_items WHERE event = 'reissued'")
    assert all("ActorDied" in r and "signal 9" in r for (r,) in reasons), reasons
    steps = [s for (s,) in q(db, "SELECT step FROM train_steps ORDER BY ts")]
    assert steps == list(range(1, len(steps) + 1))               # the trainer never stopped or repeated
    check_doc_queries(db)


PROGRESS_AFTER_RESTART = """
WITH inc AS (
    SELECT r.ts, r.proc, r.recovery_s, r.serving_s, r.reason, x.ts AS restarted_ts,
           (SELECT min(d.ts) FROM actors d WHERE d.proc = r.proc AND d.event = 'died' AND d.ts > x.ts) AS next_death
    FROM actors r JOIN actors x ON x.proc = r.proc AND x.incarnation = r.incarnation AND x.event = 'restarted'
    WHERE r.event = 'recovered')
SELECT recovery_s, serving_s, reason, epoch(ts) - recovery_s AS fault,
       (SELECT epoch(min(o.ts)) FROM {progress} o.ts > r.restarted_ts
        AND (r.next_death IS NULL OR o.ts < r.next_death)) AS first_progress,
       epoch(next_death) - epoch(ts) AS died_after_s
FROM inc r ORDER BY ts"""
"""Each ``recovered`` row with the time of its incarnation's first progress row (after its ``restarted`` row,
before the proc's next death: ``NULL`` if there is none) and how long after recovering that incarnation died."""

ROWS_LOST_S = 0.5
"""A proc ships its telemetry rows every 0.2 s: an incarnation killed this soon after its first progress may
have lost that progress row with it (the controller's ``recovered`` row, written on the controller, stays)."""


def check_doc_queries(db: Path) -> None:
    """docs/faults.md's incident SQL runs on a real chaos run and says what the tests assert."""
    import re

    queries = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "faults.md").read_text(), flags=re.S)
    assert len(queries) >= 6
    with duckdb.connect(str(db / "telemetry.duckdb"), read_only=True) as con:
        results = {}
        for sql in queries:
            cur = con.execute(sql)
            results[sql] = (tuple(d[0] for d in cur.description), cur.fetchall())
    by_cols = {cols: rows for cols, rows in results.values()}
    assert by_cols[("issued", "lost", "counted_twice")][0][1:] == (0, 0)
    assert all(back == 0 for _, _, back in by_cols[("proc", "syncs", "went_back")])
    incidents = by_cols[("ts", "kind", "event", "what", "reason", "recovery_s")]
    assert {"fault_injected", "died", "restarted", "reissued"} <= {e for _, _, e, _, _, _ in incidents}


@pytest.mark.timeout(240)
def test_trainer_killed_resumes_from_its_checkpoint(tmp_path):
    out = run(RLMESH + PPO + ["faults.kill=trainer", "faults.start_after_s=2.5", "faults.max_faults=1"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    assert_invariants(db)
    (killed_at,), = q(db, "SELECT epoch(ts) FROM actors WHERE event = 'fault_injected'")
    loads = q(db, "SELECT step, policy_version, buffer_cursor FROM checkpoints WHERE event = 'load'")
    assert len(loads) == 1
    step, version, cursor = loads[0]
    assert step >= 1 and cursor >= 1 and version > step or version == step
    before = q(db, f"SELECT max(step), max(policy_version) FROM train_steps WHERE epoch(ts) < {killed_at}")[0]
    after = [s for (s,) in q(db, f"SELECT step FROM train_steps WHERE epoch(ts) > {killed_at} ORDER BY ts")]
    # training continued from the checkpointed step (every step is checkpointed, so at most the step in
    # flight is redone; the killed proc's last ~0.2 s of rows never reached the database, so the
    # checkpoint may be newer than its last recorded row), and the first version published after the
    # restart is past every earlier one
    assert step >= before[0] and after[0] == step + 1
    assert version > before[1]
    (serving,), = q(db, "SELECT serving_s FROM actors WHERE event = 'restarted'")
    assert 0 < serving < 30
    # recovered at its first train step after the restart: the checkpoint load and the step count too
    (rec, serving_too, reason, fault, first_step, _), = q(db, PROGRESS_AFTER_RESTART.format(progress="train_steps o WHERE"))
    assert reason == "train step" and serving_too == serving and first_step is not None, (reason, first_step)
    assert first_step - fault - 1e-3 <= rec < 60 and rec > serving, (rec, serving, first_step - fault)
    print(f"\ntrainer killed: serving again {serving:.2f} s, first train step {first_step - fault:.2f} s, "
          f"recovery_s {rec:.2f} s after the kill")
    assert json.loads((db / "result.json").read_text())["env_steps"] >= 40000     # the whole budget, trained


@pytest.mark.timeout(300)
def test_trainer_collecting_its_own_rollouts_killed_resumes_from_its_checkpoint(tmp_path):
    """``generator.in_trainer`` (the A2C presets): the trainer that steps the envs is SIGKILLed mid-run; its
    replacement reloads the last call's checkpoint, the run trains its whole budget, and no rollout id or
    published version repeats."""
    # a call (and its checkpoint) every 1,500 env steps, ~23 updates: the kill 2.5 s in finds a checkpoint to
    # resume from on a slow host too, and 60k steps (~940 updates, ~6 s quiet) leave training to do after it
    a2c = ["recipe=a2c_cartpole", "trainer.total_steps=60000", "eval.every=1500", "eval.episodes=1", "eval.target=null",
           "telemetry.health_interval_s=0", "run.progress=false", "run.max_restarts=-1"]
    # ~15 s quiet, ~105 s beside 6 busy loops (load 8): the bound is for a hang, not for a slow host
    out = run(RLMESH + a2c + ["faults.kill=trainer", "faults.start_after_s=2.5", "faults.max_faults=1"], tmp_path,
              timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    (killed_at,), = q(db, "SELECT epoch(ts) FROM actors WHERE event = 'fault_injected'")
    assert q(db, "SELECT count(*) FROM actors WHERE event = 'restarted'") == [(1,)]
    (step, version), = q(db, "SELECT step, policy_version FROM checkpoints WHERE event = 'load'")
    after = q(db, f"SELECT min(step) FROM train_steps WHERE epoch(ts) > {killed_at}")[0][0]
    assert after == step + 1  # training went on from the checkpoint: at most one call's steps redone
    rows, distinct = q(db, "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts")[0]
    assert rows == distinct and rows >= json.loads((db / "result.json").read_text())["train_steps"]
    # each incarnation's versions go up, and the replacement's start at what it republished on loading (the
    # steps the dead one took after its last checkpoint were never published: they are redone, not reused)
    before = [v for (v,) in q(db, f"SELECT policy_version FROM train_steps WHERE epoch(ts) < {killed_at} ORDER BY ts")]
    after = [v for (v,) in q(db, f"SELECT policy_version FROM train_steps WHERE epoch(ts) > {killed_at} ORDER BY ts")]
    assert before == sorted(before) and after == sorted(after) and after[0] >= version and after[-1] > version
    assert json.loads((db / "result.json").read_text())["env_steps"] >= 60000     # the whole budget, trained


@pytest.mark.timeout(240)
def test_hung_generator_is_detected_by_heartbeat(tmp_path):
    out = run(RLMESH + PPO + ["faults.hang=generator", "faults.start_after_s=1", "faults.max_faults=1"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    assert_invariants(db)
    died = q(db, "SELECT reason FROM actors WHERE event = 'died'")
    assert len(died) == 1 and "heartbeat timeout" in died[0][0], died
    assert q(db, "SELECT count(*) FROM actors WHERE event = 'restarted'")[0][0] == 1


@pytest.mark.timeout(240)
def test_call_timeout_reissues_work_from_a_stuck_proc(tmp_path):
    # heartbeats would catch the hang after 60 s only: the call timeout re-issues the work first
    out = run(RLMESH + PPO + ["faults.hang=generator", "faults.start_after_s=1", "faults.max_faults=1",
                              "run.call_timeout_s=2", "run.heartbeat_timeout_s=60",
                              "trainer.total_steps=80000"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    assert_invariants(db)
    reasons = [r for (r,) in q(db, "SELECT reason FROM work_items WHERE event = 'reissued'")]
    assert reasons and all(r.startswith("CallTimeout") for r in reasons), reasons


@pytest.mark.timeout(180)
def test_repeated_failure_stops_with_a_clear_message_and_a_final_checkpoint(tmp_path):
    out = run(RLMESH + PPO + ["run.max_restarts=1", "generator.replicas=1", "faults.kill=generator",
                              "faults.every_s=1.5", "faults.start_after_s=1", "trainer.total_steps=10000000"], tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    msg = out.stderr.strip().splitlines()[-1]
    assert msg.startswith("run failed: generator[0] rl[2]") and "max_restarts=1" in msg, msg
    assert "last error: ActorDied" in msg and "final checkpoint" in msg and "resume=" in msg, msg
    db = only_run(tmp_path)
    ckpt = Path(msg.split("final checkpoint ")[1].split(";")[0])
    assert ckpt.is_file() and ckpt.parent == db / "checkpoints"
    assert q(db, "SELECT status FROM runs") == [("failed",)]
    assert q(db, "SELECT error FROM runs")[0][0] == msg.removeprefix("run failed: ")   # the cause, stored
    assert q(db, "SELECT count(*) FROM actors WHERE event = 'gave_up'")[0][0] == 1
    assert account(db)["lost"] == 0


@pytest.mark.timeout(300)
def test_controller_killed_then_resume_latest_continues_the_same_run(tmp_path):
    args = RLMESH + PPO + ["trainer.total_steps=30000"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env_for(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    ckpts: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        ckpts = sorted(tmp_path.glob("runs/2*/checkpoints/step_*.pt"))
        if ckpts and int(ckpts[-1].stem.split("_")[1]) >= 8:
            time.sleep(1.5)                                      # let its first work_items rows reach the file
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    os.kill(proc.pid, signal.SIGKILL)                           # the controller, mid-run
    proc.wait(timeout=30)
    proc.stderr.close()
    run_dir = ckpts[-1].parents[1]
    time.sleep(1.0)                                              # its workers notice and exit
    out = run(RLMESH + ["resume=latest"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert only_run(tmp_path) == run_dir.resolve()               # the same run, the same database
    acc = assert_invariants(run_dir)
    assert q(run_dir, "SELECT status FROM runs") == [("ok",)]
    gens = dict(q(run_dir, "SELECT generation, count(DISTINCT work_id) FROM work_items WHERE event = 'issued' "
                           "GROUP BY 1"))
    assert set(gens) == {0, 1} and acc["abandoned"] >= 1         # the dead controller's open items, accounted
    loads = q(run_dir, "SELECT step FROM checkpoints WHERE event = 'load'")
    assert len(loads) == 1 and loads[0][0] >= 8
    resumed_from = loads[0][0]
    after = [s for (s,) in q(run_dir, "SELECT step FROM train_steps WHERE ts > (SELECT max(ts) FROM checkpoints "
                                      "WHERE event = 'load') ORDER BY ts")]
    assert after == list(range(resumed_from + 1, resumed_from + 1 + len(after))) and after
    result = json.loads((run_dir / "result.json").read_text())
    assert result["env_steps"] >= 30000 and result["generation"] == 1 and result["abandoned"] == acc["abandoned"]


@pytest.mark.timeout(300)
def test_grpo_with_reward_procs_killed(tmp_path):
    # 100 steps: the two kills land 1 and 2 s into a run of ~10 s on a quiet machine (later, with it, on a busy one)
    out = run(RLMESH + GRPO + ["steps=100", "faults.kill=reward", "faults.every_s=1", "faults.start_after_s=1",
                               "faults.max_faults=2"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    acc = assert_invariants(db)
    restarts = q(db, "SELECT count(*) FROM actors WHERE event = 'restarted' AND actors LIKE '%reward%'")[0][0]
    assert restarts == 2, q(db, "SELECT ts, event, proc_id, incarnation, actors, reason FROM actors "  # seen once: 1
                              "WHERE event IN ('fault_injected', 'died', 'restarted', 'gave_up') ORDER BY ts")
    assert q(db, "SELECT max(step) FROM train_steps")[0][0] == 100
    # every completion was scored by a reward actor exactly as its rollout row says ...
    differ = q(db, "SELECT count(*) FROM rollouts r JOIN rewards w USING (rollout_id) WHERE w.reward <> r.reward")
    assert differ == [(0,)]
    # ... and a rewards row is missing only where a SIGKILL took the reward proc's unshipped rows
    # (a proc ships its rows every 0.2 s): each such completion was scored within a second of a kill
    unexplained = q(db, """SELECT count(*) FROM rollouts r LEFT JOIN rewards w USING (rollout_id)
        WHERE w.rollout_id IS NULL AND NOT EXISTS (
            SELECT 1 FROM actors k WHERE k.event = 'fault_injected'
            AND abs(epoch(k.ts) - epoch(r.ts)) < 1.0)""")
    assert unexplained == [(0,)] and acc["consumed"] >= 200


@pytest.mark.timeout(240)
def test_buffer_killed_its_rollouts_are_dropped_with_a_reason_and_replaced(tmp_path):
    out = run(RLMESH + PPO + ["faults.kill=buffer", "faults.every_s=1.5", "faults.start_after_s=1",
                              "faults.max_faults=2", "trainer.total_steps=60000"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    acc = assert_invariants(db)
    assert q(db, "SELECT count(*) FROM actors WHERE event = 'restarted' AND actors LIKE '%buffer%'")[0][0] >= 1
    reasons = {r for (r,) in q(db, "SELECT reason FROM work_items WHERE event IN ('dropped', 'reissued')")}
    assert reasons <= {"stale", "the buffer's proc died with it",
                       "ActorDied: buffer[0].add: the proc hosting this actor died (killed by signal 9)"}, reasons
    assert json.loads((db / "result.json").read_text())["env_steps"] >= 60000 and acc["consumed"] > 0


@pytest.mark.timeout(300)
def test_trainer_mesh_rank_killed_restarts_every_rank_from_the_sharded_checkpoint(tmp_path):
    # faults.seed=4 picks rank 0 (rl.1), then rank 1 (rl.2): each death leaves its peer inside a
    # collective, which only the controller's restart of the whole mesh ends (trainer.group_timeout_s
    # is far above the test's timeout: waiting it out would fail the test)
    out = run(RLMESH + GRPO + ["steps=150", "trainer.ranks=2", "trainer.group_timeout_s=900", "faults.kill=trainer",
                               "faults.seed=4", "faults.start_after_s=5", "faults.every_s=3", "faults.max_faults=2"],
              tmp_path, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    db = only_run(tmp_path)
    acc = assert_invariants(db)                                  # nothing lost, no rollout trained twice
    assert acc["consumed"] == 150 * 2                             # every step trained its two work items once
    assert q(db, "SELECT max(step) FROM train_steps")[0][0] == 150
    kills = [p for (p,) in q(db, "SELECT proc FROM actors WHERE event = 'fault_injected' ORDER BY ts")]
    assert kills == ["rl.1", "rl.2"], kills
    # each incident: the victim died, its peer was restarted on purpose, and both ranks came back
    asked = q(db, "SELECT proc, reason FROM actors WHERE event = 'restart_requested' ORDER BY ts")
    assert [p for p, _ in asked] == ["rl.2", "rl.1"], asked
    assert all("trainer mesh: rank" in r and "every rank restarts" in r for _, r in asked), asked
    back = q(db, "SELECT proc, incarnation, serving_s FROM actors WHERE event = 'restarted' ORDER BY ts")
    assert sorted((p, i) for p, i, _ in back) == [("rl.1", 1), ("rl.1", 2), ("rl.2", 1), ("rl.2", 2)], back
    assert all(0 < s < 60 for _, _, s in back), back
    # each incident after the first checkpoint loads the newest one once (rank 0 records it: on a busy
    # host a kill may come before it, and the replacements warm-start again) and training goes on from
    # the step after it
    loads = q(db, "SELECT epoch(ts), step, path FROM checkpoints WHERE event = 'load' ORDER BY ts")
    (after_save,), = q(db, "SELECT count(*) FROM actors a WHERE event = 'fault_injected' AND EXISTS (SELECT 1 FROM "
                           "checkpoints c WHERE c.event = 'save' AND c.ts < a.ts)")
    assert after_save <= len(loads) <= 2 and all(p.endswith(".dcp") for _, _, p in loads), (after_save, loads)
    for at, step, _ in loads:
        (first,), = q(db, f"SELECT min_by(step, ts) FROM train_steps WHERE epoch(ts) > {at}")
        assert first == step + 1, (at, step, first)
    # per-rank telemetry (train_ranks): a row per step and rank; FSDP2 leaves each rank about half of the
    # parameters and optimizer state; each rank publishes its part of the weights (trainer.publish=sharded)
    per = {r: (n, p, o, pub) for r, n, p, o, pub in q(db, "SELECT rank, count(DISTINCT step), max(param_bytes), "
                                                          "max(optim_bytes), max(publish_bytes) FROM train_ranks "
                                                          "GROUP BY rank")}
    assert set(per) == {0, 1} and min(n for n, _, _, _ in per.values()) >= 140, per
    (p0, o0), (p1, o1) = per[0][1:3], per[1][1:3]
    assert abs(p0 - p1) < 0.1 * p0 and abs(o0 - o1) < 0.1 * o0 and o0 > p0, per
    pub0, pub1 = per[0][3], per[1][3]
    assert pub0 + pub1 > p0 + p1 - 1 and abs(pub0 - pub1) < 0.1 * pub0, per  # the whole weights, in halves
