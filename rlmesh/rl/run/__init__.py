"""The run machinery of a recipe, apart from the RL maths: where procs come from and what is
spawned on them (:mod:`.placement`), the work items and their staleness bound (:mod:`.schedule`),
keeping the run going through proc failures (:mod:`.resilience`), warm-up phases shown while
actors start (:mod:`.warmup`), and what the user sees live and at the end (:mod:`.report`).

Why a package of its own: ``rl/algorithms``, ``rl/losses`` and ``rl/models`` are tensors in,
tensors out; these modules talk to actors, telemetry and launchers. Both halves live in the
``rlmesh.rl`` layer because the actors use them too (a generator's work items, a trainer's
placement, an engine's warm-up phase), and a layer may not import upward into
``rlmesh.recipes``, whose loop (:mod:`rlmesh.recipes.loop`) drives them.
"""
