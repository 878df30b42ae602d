"""The built-in tables: every column's name, DuckDB type and meaning, in one place.

This is the contract between the framework (which fills the tables) and the user
(who queries them): ``docs/telemetry.md`` is checked against it by a test, and
``rlmesh sql RUN --schema`` prints it. Later layers (``rl/``, ``weights/``) fill the
tables declared here rather than inventing their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # DuckDB type
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    filled_by: str = "the framework"

    def column(self, name: str) -> Column | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None


def _c(name: str, type_: str, doc: str) -> Column:
    return Column(name, type_, doc)


#: Added to every row of every table. ``mesh``/``rank``/``proc``/``host`` come from
#: ``rm.context()`` inside an actor; in the controller they are ``controller``, ``-1``,
#: ``controller`` and the controller's host name. A row may set them itself (the
#: ``actors`` table does, so that its rows name the proc they describe).
AUTO: tuple[Column, ...] = (
    _c("run_id", "VARCHAR", "id of the run (directory name under runs/)"),
    _c("ts", "TIMESTAMPTZ", "when the row was recorded (UTC, microseconds)"),
    _c("mesh", "VARCHAR", "mesh name of the recording actor; 'controller' in the controller"),
    _c("rank", "BIGINT", "rank of the recording actor in its mesh; -1 in the controller"),
    _c("proc", "VARCHAR", "proc id (stable across restarts); 'controller' in the controller"),
    _c("host", "VARCHAR", "host name of the recording process"),
)
AUTO_NAMES = frozenset(c.name for c in AUTO)

_T = Table
BUILTIN: dict[str, Table] = {t.name: t for t in [
    _T("runs", "one row per run: what ran, with which config, and how it ended", (
        _c("id", "VARCHAR", "run id"),
        _c("config", "JSON", "the run's config (rm.telemetry.set_config), as JSON"),
        _c("start_ts", "TIMESTAMPTZ", "when the run started"),
        _c("end_ts", "TIMESTAMPTZ", "when it ended; NULL while running or if the controller was killed"),
        _c("status", "VARCHAR", "running | ok | failed (an exception ended the controller) | interrupted "
           "(Ctrl-C or SIGTERM: a clean stop) | crashed (the controller died; set by the next rlmesh run/runs)"),
        _c("error", "VARCHAR", "why the run failed or stopped (one line); NULL when ok or running"),
        _c("argv", "VARCHAR", "the controller's command line"),
        _c("pid", "BIGINT", "controller pid"),
        _c("host", "VARCHAR", "controller host"),
    ), "the telemetry service"),
    _T("actors", "proc lifecycle events from the runtime's supervisor; mesh/rank/proc/host name the proc", (
        _c("event", "VARCHAR", "spawned | died | restarted | recovered (a replacement made progress: a train step, a "
           "rollout landed) | stopped | gave_up | fault_injected | restart_requested | fenced"),
        _c("pid", "BIGINT", "OS pid of the process (NULL when unknown)"),
        _c("incarnation", "BIGINT", "0 for the first process of a proc, +1 per restart"),
        _c("exit_code", "BIGINT", "exit status of a dead proc (NULL if killed by a signal)"),
        _c("signal", "BIGINT", "signal that killed it (9 = SIGKILL), else NULL"),
        _c("reason", "VARCHAR", "why, in words (e.g. 'heartbeat timeout')"),
        _c("actors", "VARCHAR", "comma-separated ids of the actors hosted by the proc"),
        _c("recovery_s", "DOUBLE", "recovered rows: seconds from the fault (or the death) to the replacement making "
           "progress (a trainer's next train step done, a generator's next rollout landed; `reason` says which)"),
        _c("serving_s", "DOUBLE", "restarted and recovered rows: seconds from the fault (or the death) to the "
           "replacement serving (its actors re-created)"),
    ), "the runtime's event sink (controller)"),
    _T("spans", "one row per endpoint call, as seen by the proc that served it", (
        _c("actor_id", "VARCHAR", "id of the serving actor"),
        _c("endpoint", "VARCHAR", "endpoint name"),
        _c("caller", "VARCHAR", "who called: 'controller' or the calling actor's id"),
        _c("start_ts", "TIMESTAMPTZ", "when the call started"),
        _c("duration_s", "DOUBLE", "wall time spent serving it"),
        _c("outcome", "VARCHAR", "ok | error"),
        _c("error", "VARCHAR", "exception type and message when outcome = 'error'"),
        _c("bytes_in", "BIGINT", "argument payload size"),
        _c("bytes_out", "BIGINT", "result payload size"),
        _c("weight", "BIGINT", "calls this row stands for (>1 when hot calls are sampled); use sum(weight) to count"),
    ), "the worker's span sink"),
    _T("refusals", "messages a socket of the run dropped unread: forged, cut, replayed or reordered "
       "(at most one row per peer and channel every 10 s)", (
        _c("channel", "VARCHAR", "which socket refused: e.g. 'actor calls to gen.0', 'controller', 'telemetry ingest'"),
        _c("peer", "VARCHAR", "the sender's address (or caller, for a call id served before)"),
        _c("reason", "VARCHAR", "why, in words: bad MAC, too short, replayed or reordered (stale counter), call id served already"),
        _c("count", "BIGINT", "messages from that peer refused since the previous row"),
        _c("rejected_total", "BIGINT", "messages that failed the MAC on this channel so far"),
        _c("replayed_total", "BIGINT", "replayed or reordered messages dropped on this channel so far"),
    ), "the transport's refusal sink"),
    _T("rollouts", "one row per rollout from a generator: a num_envs x num_steps segment (gym) or one completion (LLM)", (
        _c("rollout_id", "VARCHAR", "unique id of the rollout"),
        _c("policy_version", "BIGINT", "weight version that produced it"),
        _c("reward", "DOUBLE", "the completion's reward (LLM); mean return of the episodes that ended inside (gym, NULL if none)"),
        _c("length", "BIGINT", "transitions (gym) or tokens (LLM)"),
        _c("env", "VARCHAR", "environment or task name"),
        _c("duration_s", "DOUBLE", "time to produce it"),
        _c("episodes", "BIGINT", "episodes that ended inside it (gym rollouts; NULL for completions)"),
        _c("samples", "BIGINT", "trainable samples inside: transitions (gym) or 1 (a completion)"),
        _c("source", "VARCHAR", "where the prompt came from: the data file's name (LLM; NULL for gym)"),
        _c("finish_reason", "VARCHAR", "'stop' (EOS or a stop string) or 'length' (cut at max_new_tokens) (LLM)"),
        _c("prompt_tokens", "BIGINT", "prompt length in tokens, after any truncation (LLM)"),
        _c("prompt_truncated", "BOOLEAN", "the prompt was cut to generator.max_prompt_tokens (LLM)"),
    ), "rlmesh.rl generators"),
    _T("samples", "a bounded sample of completions with their prompts and rewards, to read what the policy writes", (
        _c("rollout_id", "VARCHAR", "the completion's rollout id"),
        _c("policy_version", "BIGINT", "weight version that wrote it"),
        _c("prompt", "VARCHAR", "the prompt as the task wrote it (before the chat template; cut to generator.sample_chars)"),
        _c("completion", "VARCHAR", "the decoded completion, cut to generator.sample_chars"),
        _c("answer", "VARCHAR", "the reference answer"),
        _c("reward", "DOUBLE", "the completion's reward"),
        _c("source", "VARCHAR", "where the prompt came from (a data file's name)"),
    ), "rlmesh.rl LLM generators (generator.samples_per_item per work item)"),
    _T("rewards", "one row per scored rollout from a reward actor", (
        _c("rollout_id", "VARCHAR", "rollout scored"),
        _c("reward", "DOUBLE", "score"),
        _c("scorer", "VARCHAR", "reward function or model"),
        _c("duration_s", "DOUBLE", "time to score it"),
    ), "rlmesh.rl reward actors"),
    _T("train_steps", "one row per optimiser step", (
        _c("step", "BIGINT", "optimiser step"),
        _c("policy_version", "BIGINT", "weight version after the step"),
        _c("loss", "DOUBLE", "total loss"),
        _c("lr", "DOUBLE", "learning rate"),
        _c("grad_norm", "DOUBLE", "gradient norm before clipping"),
        _c("samples", "BIGINT", "samples in the batch"),
        _c("duration_s", "DOUBLE", "wall time of the step"),
        _c("metrics", "JSON", "other namespaced metrics, e.g. {\"losses/approx_kl\": 0.01}"),
    ), "rlmesh.rl trainers"),
    _T("train_ranks", "one row per train step per trainer rank (`rank`; one row a step for a one-proc trainer): where the step's time went on that rank, what it published and the memory it holds (docs/trainer.md)", (
        _c("step", "BIGINT", "optimiser step (train_steps.step)"),
        _c("ranks", "BIGINT", "ranks of the trainer mesh (trainer.ranks)"),
        _c("policy_version", "BIGINT", "weight version after the step"),
        _c("step_s", "DOUBLE", "wall time of the train call on this rank: the parts below and the bookkeeping between them"),
        _c("sample_s", "DOUBLE", "rank 0: waiting for the buffer's batch (0 on the other ranks)"),
        _c("handoff_s", "DOUBLE", "the batch hand-off from rank 0 over the process group; on ranks > 0 it includes waiting for rank 0's sample"),
        _c("train_step_s", "DOUBLE", "the algorithm's train_step: forward_s + backward_s + optimizer_s"),
        _c("forward_s", "DOUBLE", "inside the model's forward (FSDP2's all-gathers included); NULL when the trainer never calls the model itself"),
        _c("backward_s", "DOUBLE", "the rest of train_step: the backward with FSDP2's reduce-scatters or DDP's all-reduces, gradient clipping, the loss"),
        _c("optimizer_s", "DOUBLE", "inside optimizer.step (local to each rank)"),
        _c("sync_s", "DOUBLE", "the step's collectives outside the model: the token count's all-reduce and the metrics' gather to rank 0"),
        _c("publish_s", "DOUBLE", "publishing the weights: each rank its own part (trainer.publish=sharded), or every rank's part in gathering the full state dict and rank 0's publish (gathered)"),
        _c("publish_bytes", "BIGINT", "bytes this rank published through rlmesh.weights this step (sharded: its own part; gathered: rank 0 the whole, 0 on the others)"),
        _c("checkpoint_s", "DOUBLE", "writing the checkpoint (every rank writes its shard of a sharded one)"),
        _c("param_bytes", "BIGINT", "parameter bytes this rank holds (its shards under FSDP2)"),
        _c("optim_bytes", "BIGINT", "optimizer state bytes this rank holds (its shards under FSDP2)"),
        _c("ref_bytes", "BIGINT", "parameter bytes of the frozen modules this rank holds beside the policy: GRPO's KL reference copy (its shards under FSDP2); 0 without one, and with LoRA (the reference is the model itself)"),
        _c("rss_peak_bytes", "BIGINT", "the proc's peak resident memory so far"),
        _c("device_peak_bytes", "BIGINT", "peak CUDA memory allocated so far (NULL on CPU)"),
    ), "rlmesh.rl trainers"),
    _T("phases", "progress of warm-up phases that actors run before training (GRPO's SFT warm start, a generator's engine start): a row when one starts, about every second while it runs, and when it ends", (
        _c("phase", "VARCHAR", "what is warming up, e.g. 'SFT warm start', 'engine start'"),
        _c("state", "VARCHAR", "started | running | done | failed"),
        _c("completed", "BIGINT", "units done so far"),
        _c("total", "BIGINT", "units in the phase (NULL when unknown, e.g. an engine start)"),
        _c("unit", "VARCHAR", "what completed and total count, e.g. 'steps'"),
        _c("elapsed_s", "DOUBLE", "seconds since the phase started"),
    ), "rlmesh.rl actors (rlmesh.rl.run.warmup.WarmupPhase)"),
    _T("evals", "one row per evaluation of the policy (greedy, on fresh envs or held-out prompts)", (
        _c("step", "BIGINT", "trainer step the evaluated weights came from"),
        _c("policy_version", "BIGINT", "weight version evaluated"),
        _c("metric", "VARCHAR", "mean_return (gymnasium recipes) | mean_reward (held-out prompts)"),
        _c("value", "DOUBLE", "the metric's value"),
        _c("episodes", "BIGINT", "episodes (gym) or prompts (LLM) it averages over"),
        _c("env_steps", "BIGINT", "trained env steps (gym) or completions (LLM) before these weights"),
        _c("duration_s", "DOUBLE", "time the evaluation took"),
    ), "rlmesh.rl evaluators"),
    _T("turns", "one row per model turn of a multi-turn, tool-using episode (rlmesh.rl.agentic), written once the buffer accepted the episode", (
        _c("rollout_id", "VARCHAR", "the episode's id (= its rollouts row: <work_id>/<k>)"),
        _c("turn", "BIGINT", "0 for the first model turn"),
        _c("tool", "VARCHAR", "the tool this turn called; NULL for a turn without a call (a final answer)"),
        _c("args", "VARCHAR", "the call's arguments, truncated to 200 characters"),
        _c("tool_latency_s", "DOUBLE", "time the tool ran (in the env proc); NULL without a call"),
        _c("env_latency_s", "DOUBLE", "from sending the turn to the environment to its answer (tool + transport)"),
        _c("tokens_out", "BIGINT", "tokens the model generated this turn"),
        _c("tokens_in", "BIGINT", "observation tokens appended after it (0 on the last turn)"),
        _c("reward", "DOUBLE", "the environment's reward for this turn"),
        _c("error", "VARCHAR", "the tool's error (timeout | crashed | memory | exception | unknown_tool: detail); NULL if it answered"),
        _c("policy_version", "BIGINT", "weight version that generated this turn (partial rollouts: may differ between turns)"),
        _c("ended", "VARCHAR", "on the episode's last turn: done | max_turns | max_tokens; NULL before"),
    ), "rlmesh.rl.agentic generators"),
    _T("work_items", "every transition of every work item a recipe's controller issued: the account that shows nothing was lost or counted twice", (
        _c("work_id", "VARCHAR", "the item's id (= the rollout id in the buffer; LLM completions are <work_id>/<k>)"),
        _c("event", "VARCHAR", "issued | reissued | completed | duplicate | requeued | consumed | dropped | abandoned | unused | rescored (a reward proc died while scoring it)"),
        _c("reason", "VARCHAR", "why (reissued: the error; dropped: stale/capacity; abandoned/unused: in words)"),
        _c("attempt", "BIGINT", "re-issues of this id so far (0 = first attempt)"),
        _c("generation", "BIGINT", "0 for the run's first controller, +1 per resume (rlmesh run resume=...)"),
    ), "rlmesh.rl recipes (the controller's work scheduler)"),
    _T("checkpoints", "one row per trainer checkpoint written or loaded", (
        _c("event", "VARCHAR", "save | load"),
        _c("step", "BIGINT", "trainer step the checkpoint holds"),
        _c("policy_version", "BIGINT", "weight version published with it"),
        _c("path", "VARCHAR", "the checkpoint file"),
        _c("bytes", "BIGINT", "file size"),
        _c("buffer_cursor", "BIGINT", "lease id of the last batch trained (the buffer requeues what came after)"),
        _c("duration_s", "DOUBLE", "time to write, or to load and republish"),
    ), "rlmesh.rl trainers"),
    _T("weight_syncs", "one row per weight transfer to one subscriber", (
        _c("name", "VARCHAR", "published weights name, e.g. 'policy'"),
        _c("version", "BIGINT", "version transferred"),
        _c("transport", "VARCHAR", "shm | cuda-ipc | rdma | tcp (rlmesh.weights.selection.Transport)"),
        _c("bytes", "BIGINT", "bytes moved"),
        _c("duration_s", "DOUBLE", "transfer time"),
        _c("ok", "BOOLEAN", "false when a checksum failed and the version was rejected"),
    ), "rlmesh.weights"),
    _T("file_syncs", "one row per host per workspace sync (rlmesh.workspace.sync_workspace)", (
        _c("sync_id", "VARCHAR", "id of the sync (also the per-run directory name on each host)"),
        _c("target_host", "VARCHAR", "host the tree landed on ('proc-N' when hosts are simulated)"),
        _c("dest", "VARCHAR", "directory the tree landed in (the controller's own path on its host)"),
        _c("files", "BIGINT", "files in the manifest"),
        _c("files_sent", "BIGINT", "files (re)written on the host"),
        _c("files_skipped", "BIGINT", "entries unchanged since the last sync into dest"),
        _c("bytes_total", "BIGINT", "bytes of all files in the manifest"),
        _c("bytes_sent", "BIGINT", "chunk bytes the host received"),
        _c("chunks_sent", "BIGINT", "chunks the host received"),
        _c("chunks_deduplicated", "BIGINT", "chunks the host's store held already (not sent)"),
        _c("transport", "VARCHAR", "rdma | tcp | cma (one machine) | same-host (nothing copied): how chunks crossed this host's link"),
        _c("relinks", "BIGINT", "times the host's upstream was replaced because the host before it in the chain died or its pull failed"),
        _c("duration_s", "DOUBLE", "seconds from the host's first request to its tree materialised"),
        _c("error", "VARCHAR", "why the host's sync failed; empty when it succeeded"),
    ), "rlmesh.workspace"),
    _T("host_health", "per host, every second: CPU, memory and load (psutil)", (
        _c("cpu_pct", "DOUBLE", "whole-host CPU utilisation, 0-100"),
        _c("mem_total", "BIGINT", "physical memory, bytes"),
        _c("mem_available", "BIGINT", "memory available to new work, bytes"),
        _c("mem_used_pct", "DOUBLE", "percent of memory in use"),
        _c("swap_used", "BIGINT", "swap in use, bytes"),
        _c("rss", "BIGINT", "resident memory of this job's processes on the host (sampler and its children), bytes"),
        _c("load_1m", "DOUBLE", "1-minute load average"),
        _c("load_5m", "DOUBLE", "5-minute load average"),
        _c("load_15m", "DOUBLE", "15-minute load average"),
    ), "one health sampler per host"),
    _T("proc_health", "per proc (controller and every worker), every 5 s: its own memory, CPU, threads and open "
       "files (psutil); mesh/rank/proc name the proc", (
        _c("pid", "BIGINT", "OS pid of the process (a restarted proc gets a new one)"),
        _c("rss", "BIGINT", "resident memory, bytes"),
        _c("vms", "BIGINT", "virtual memory, bytes"),
        _c("cpu_pct", "DOUBLE", "CPU used since the previous sample, percent of one core (over 100 with several threads busy)"),
        _c("threads", "BIGINT", "threads of the process"),
        _c("fds", "BIGINT", "open file descriptors (NULL where the OS does not say)"),
        _c("warning", "VARCHAR", "set on the sample where RSS was found growing without bound (see docs/telemetry.md); else NULL"),
    ), "every proc's health thread, about itself"),
    _T("gpu_health", "per GPU, every second (NVML); no GPU means no rows, never fake ones", (
        _c("gpu", "BIGINT", "NVML device index"),
        _c("uuid", "VARCHAR", "GPU UUID"),
        _c("name", "VARCHAR", "product name"),
        _c("util_pct", "DOUBLE", "GPU (SM) utilisation, 0-100"),
        _c("mem_util_pct", "DOUBLE", "memory-controller utilisation, 0-100"),
        _c("mem_used", "BIGINT", "device memory used, bytes"),
        _c("mem_total", "BIGINT", "device memory, bytes"),
        _c("temp_c", "DOUBLE", "core temperature, Celsius"),
        _c("power_w", "DOUBLE", "power draw, watts"),
        _c("sm_clock_mhz", "BIGINT", "current SM clock"),
        _c("ecc_corrected", "BIGINT", "volatile corrected ECC errors (NULL where ECC is off)"),
        _c("ecc_uncorrected", "BIGINT", "volatile uncorrected ECC errors (NULL where ECC is off)"),
        _c("xid", "BIGINT", "last XID error seen since the previous sample, else NULL"),
        _c("xid_count", "BIGINT", "XID errors seen since the previous sample"),
    ), "one health sampler per host"),
    _T("logs", "every line a worker proc wrote to stdout/stderr and every Python logging record (workers and controller); read from the proc's pipe by its launcher, so a SIGKILLed proc's last lines are here", (
        _c("incarnation", "BIGINT", "0 for the first process of a proc, +1 per restart (NULL for the controller)"),
        _c("pid", "BIGINT", "OS pid of the writing process (NULL when unknown, e.g. a pod)"),
        _c("stream", "VARCHAR", "stdout | stderr | log (a logging record)"),
        _c("level", "VARCHAR", "DEBUG | INFO | WARNING | ERROR | CRITICAL for logging records; NULL for stdout/stderr lines"),
        _c("logger", "VARCHAR", "logger name (logging records)"),
        _c("message", "VARCHAR", "the line, or the record's formatted message"),
        _c("exception", "VARCHAR", "traceback text of a record logged with exc_info, else NULL"),
        _c("actor", "VARCHAR", "mesh[rank] of the actor that logged the record, when logged inside an actor"),
    ), "the launcher's output capture (rlmesh.launch.capture) and the controller's log handler"),
    _T("debug_sessions", "actors paused for a debugger (breakpoint() or post-mortem) and resumed: how `rlmesh debug` finds a paused actor on any host", (
        _c("event", "VARCHAR", "paused | resumed"),
        _c("actor", "VARCHAR", "actor id of the paused actor (`rlmesh debug --attach` takes it, or mesh[rank])"),
        _c("pid", "BIGINT", "OS pid of the paused actor's process"),
        _c("addr", "VARCHAR", "its debugger socket, unique per pause (authenticated, like all rlmesh traffic)"),
        _c("file", "VARCHAR", "source file it paused in"),
        _c("line", "BIGINT", "line it paused at"),
        _c("function", "VARCHAR", "function it paused in"),
        _c("reason", "VARCHAR", "breakpoint() | exception <type>: <message> (post-mortem)"),
        _c("since", "DOUBLE", "when it paused (paused rows) or resumed (resumed rows), epoch seconds"),
    ), "rlmesh.actor.debugger in workers (through the debug sink)"),
    _T("stacks", "Python stack of every thread of a proc, one row per frame: taken by `rlmesh stacks` and just before a hung proc is killed", (
        _c("incarnation", "BIGINT", "incarnation of the proc whose stacks these are"),
        _c("pid", "BIGINT", "OS pid of that process"),
        _c("dump_id", "VARCHAR", "one id per dump: all frames of all threads taken at once"),
        _c("reason", "VARCHAR", "why it was taken: heartbeat timeout | signal (rlmesh stacks, a SIGUSR2)"),
        _c("thread", "VARCHAR", "thread ident, hex (as faulthandler prints it)"),
        _c("thread_name", "VARCHAR", "thread name (NULL when the proc was too stuck to name its threads)"),
        _c("current", "BOOLEAN", "the thread the dump signal was handled on (usually the main thread); not necessarily the one holding the GIL"),
        _c("depth", "BIGINT", "0 = the frame executing now, 1 = its caller, ..."),
        _c("function", "VARCHAR", "function name"),
        _c("file", "VARCHAR", "source file"),
        _c("line", "BIGINT", "line number in file"),
    ), "the launcher's output capture (faulthandler dump on SIGUSR2)"),
]}

#: Not filled on purpose: rows the service could not store (type mismatch), kept so nothing is lost silently.
REJECTED_TABLE = Table("_rejected", "rows that did not fit their table's types, kept with the reason", (
    _c("run_id", "VARCHAR", "id of the run"),
    _c("ts", "TIMESTAMPTZ", "when the service refused the rows"),
    _c("table_name", "VARCHAR", "table the rows were meant for"),
    _c("reason", "VARCHAR", "the schema error, naming column and both types"),
    _c("row", "VARCHAR", "the row, as JSON"),
), "the telemetry service")
_M = ("policy_loss", "value_loss", "entropy", "approx_kl", "kl", "clip_fraction", "explained_variance")
#: Views over the tables (created with every run file): the common train_steps.metrics as real columns.
VIEWS: dict[str, Table] = {"train_metrics": _T("train_metrics", "view over train_steps: the common losses/* metrics as columns, plus samples per second (NULL where a trainer does not report one)", (
    *(_c(c, t, d) for c, t, d in (("step", "BIGINT", "optimiser step"), ("policy_version", "BIGINT", "weight version after the step"),
                                  ("loss", "DOUBLE", "total loss"), ("lr", "DOUBLE", "learning rate"), ("grad_norm", "DOUBLE", "gradient norm before clipping"))),
    *(_c(m, "DOUBLE", f"metrics['losses/{m}']") for m in _M),
    _c("samples_per_s", "DOUBLE", "samples / duration_s of the step"),
), "DuckDB (a view; nothing is stored twice)")}
VIEW_SQL: dict[str, str] = {"train_metrics": (
    "SELECT run_id, ts, mesh, rank, proc, host, step, policy_version, loss, lr, grad_norm, "
    + ", ".join(f"TRY_CAST(json_extract_string(metrics, '$.\"losses/{m}\"') AS DOUBLE) AS {m}" for m in _M)
    + ", samples / nullif(duration_s, 0) AS samples_per_s FROM train_steps")}
DOCUMENTED: dict[str, Table] = {**BUILTIN, REJECTED_TABLE.name: REJECTED_TABLE, **VIEWS}
