"""The rollout manager's streaming (no Ray, no model): groups verified as they arrive, the
window and the request budget, groups kept on one engine, --deterministic independent of
timing, nothing left running after an error. Engines: tests/driver/scripted.py."""

from __future__ import annotations

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler
from megatron_dapo.driver.rollout_manager import RolloutManager, RolloutStallError
from tests.driver.scripted import Scorer, ScriptedEngine, Tok, local_pool, sample_index


def length_of(i: int, j: int) -> int:
    return 2 + 2 * (i % 3) + j  # prompts 0, 3, 6, ... end first


def respond(req, right=lambda i, j: j == 0, seed_dependent=False):
    i, prefix = req.prompt_ids[0], req.prompt_ids[2:]
    j = sample_index(req.rid)
    extra = (req.params.seed or 0) % 7 if seed_dependent else 0
    full = [1 if right(i, j) else 0] + [10 + (i + j + t + extra) % 40 for t in range(1, length_of(i, j) + extra)]
    return full[len(prefix) :], "stop"


def make(argv=(), engines=1, slots=10**9, respond_fn=respond, scorer=None, n_prompts=60):
    cfg = parse_args(
        [
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "4",
            "--max-response-length",
            "16",
            "--overlong-buffer-length",
            "4",
            "--no-progress",
            *argv,
        ]
    )
    clock = [0]
    engs = [ScriptedEngine(respond_fn, slots=slots, clock=clock) for _ in range(engines)]
    pool = local_pool(engs)
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(n_prompts)]
    sampler = ResumableSampler(len(ds), seed=0, shuffle=False)
    return RolloutManager(cfg, ds, sampler, pool, scorer or Scorer(), Tok()), engs, pool


def test_a_group_is_verified_when_its_last_sample_ends_not_with_the_longest_response():
    mgr, _, _ = make(["--rollout-batch-size", "4", "--no-dynamic-sampling"])
    res = mgr.collect(1)
    by = {g.prompt_index: g for g in res.generated}
    assert sorted(by) == [0, 1, 2, 3] and res.submitted_prompts == 4
    assert len({s.submitted_at for g in res.generated for s in g.samples}) == 1  # one submission
    # decode steps: prompts 0 and 3 end at step 3, 1 at step 5, 2 at step 7
    assert [g.prompt_index for g in res.generated] == [0, 3, 1, 2]
    longest = max(s.finished_at for g in res.generated for s in g.samples)
    assert longest == 7.0
    for i, step in ((0, 3.0), (3, 3.0), (1, 5.0), (2, 7.0)):
        assert by[i].scored_at == step == max(s.finished_at for s in by[i].samples)
    assert by[0].scored_at < longest  # a blocking batch would have verified it at step 7


def test_window_and_refill_keep_at_most_W_groups_in_flight():
    in_flight = []

    class Counting(ScriptedEngine):
        def poll(self, timeout_s):
            in_flight.append(len({r.group for r in self.waiting} | {x[0].group for x in self.running}))
            return super().poll(timeout_s)

    mgr, engs, _ = make(["--rollout-batch-size", "6", "--over-sampling-batch-size", "3"])
    engs[0].__class__ = Counting
    # prompts % 3 == 1 all wrong, the others mixed: 2 of 3 kept
    engs[0].respond = lambda req: respond(req, right=lambda i, j: j == 0 and i % 3 != 1)
    res = mgr.collect(1)
    assert len(res.groups) == 6 and max(in_flight) == 3
    assert res.num_all_wrong == sum(1 for g in res.generated if g.prompt_index % 3 == 1)
    assert res.num_gen_batches == -(-res.submitted_prompts // 3)


def test_the_request_budget_is_max_num_gen_batches_windows():
    mgr, engs, _ = make(
        ["--over-sampling-batch-size", "3", "--max-num-gen-batches", "4"],
        respond_fn=lambda req: respond(req, right=lambda i, j: False),
    )
    with pytest.raises(
        RolloutStallError,
        match=r"after 12 prompts.*--max-num-gen-batches 4 x "
        r"--over-sampling-batch-size 3 \(groups were 0 all-correct, 12 all-wrong\)",
    ):
        mgr.collect(1)
    assert len({r.group for r in engs[0].seen}) == 12


def test_a_groups_requests_go_to_one_engine_and_the_load_is_spread():
    mgr, engs, _ = make(["--rollout-batch-size", "4", "--over-sampling-batch-size", "8"], engines=2)
    mgr.collect(1)
    groups = [{r.group for r in e.seen} for e in engs]
    assert groups[0] and groups[1] and not groups[0] & groups[1]
    assert abs(len(engs[0].seen) - len(engs[1].seen)) <= 2


def _summary(res):
    return [
        (g.prompt_index, [(s.response_ids, s.stale_len, s.token_versions, s.acc) for s in g.samples])
        for g in res.groups
    ]


@pytest.mark.parametrize("flags", [[], ["--reuse-surplus-groups"], ["--partial-rollout", "true"]])
def test_deterministic_mode_does_not_depend_on_timing(flags):
    """The same steps whatever order the requests end in: one slot (strictly sequential), many
    slots, two engines."""
    argv = ["--deterministic", "--over-sampling-batch-size", "5", *flags]
    seeded = lambda req: respond(req, right=lambda i, j: (i + j + (req.params.seed or 0)) % 3 == 0, seed_dependent=True)
    runs = []
    for engines, slots in ((1, 1), (1, 10**9), (2, 3)):
        mgr, _, _ = make(argv, engines=engines, slots=slots, respond_fn=seeded)
        runs.append(
            [
                (_summary(r), r.submitted_prompts, r.discarded_samples, r.partial_pending, r.aborted_samples)
                for r in (mgr.collect(step) for step in (1, 2, 3))
            ]
        )
    assert runs[0] == runs[1] == runs[2]
    assert all(x[4] == 0 for x in runs[0])  # nothing aborted: the groups in flight ran to their end
    assert sum(x[1] for x in runs[0]) > 6  # some groups were rejected and replaced


def test_nothing_keeps_running_after_an_error():
    class Failing(Scorer):
        def score(self, items):
            raise RuntimeError("verifier down")

    mgr, engs, pool = make(["--over-sampling-batch-size", "6"], scorer=Failing())
    with pytest.raises(RuntimeError, match="verifier down"):
        mgr.collect(1)
    assert pool.outstanding == 0 and not engs[0].running and not engs[0].waiting


def test_old_checkpoint_pending_prompts_are_generated_first():
    mgr, engs, _ = make(["--partial-rollout", "true"])
    mgr.load_state_dict({"surplus": [], "pending": [], "pending_prompts": [5, 9]})
    res = mgr.collect(1)
    assert [r.prompt_ids for r in engs[0].seen[:4]] == [[5, 7], [5, 7], [9, 7], [9, 7]]
    assert res.partial_resumed == 4


class EngineDied(RuntimeError):
    pass


@pytest.mark.parametrize("pause_others", [True, False])
def test_a_restart_pauses_the_other_engines_and_changes_nothing_in_deterministic_mode(pause_others):
    """Engine 0 dies at its 3rd poll; the re-sync (which may release the other engines' KV
    caches) finds nothing running elsewhere; every stopped request starts again from its prompt
    with its seed, so the step equals the one without the fault. Without the pause (async
    training: the re-sync leaves the other engines alone) engine 1 keeps generating through the
    restart, only engine 0's requests start again, and the step is the same too."""
    from megatron_dapo.driver.engine_pool import EnginePool, LocalTransport

    argv = ["--deterministic", "--over-sampling-batch-size", "6", "--rollout-batch-size", "3"]
    seeded = lambda req: respond(req, right=lambda i, j: (i + j + (req.params.seed or 0)) % 3 == 0, seed_dependent=True)

    class Transport(LocalTransport):
        dead = (EngineDied,)

    def run(fault: bool):
        clock, polls, during_resync = [0], [0], []
        engines = []

        def make_engine(i):
            eng = ScriptedEngine(seeded, slots=3, clock=clock)
            if fault and i == 0 and not engines:
                real = eng.poll

                def poll(timeout_s):
                    polls[0] += 1
                    if polls[0] == 3:
                        raise EngineDied("killed")
                    return real(timeout_s)

                eng.poll = poll
            engines.append(eng)
            return eng

        def resync(handles):
            other = engines[1]
            # engine 1 had requests of its own, stopped before the re-sync
            during_resync.append((len(other.running) + len(other.waiting), len(other.seen) > 0))

        pool = EnginePool(
            make_engine, 2, resync, timeout_s=60.0, transport=Transport(), pause_others_on_restart=pause_others
        )
        pool.clock = lambda: float(clock[0])
        mgr, _, _ = make(argv)
        mgr.engines = pool
        res = [mgr.collect(step) for step in (1, 2)]
        return [(_summary(r), r.submitted_prompts) for r in res], pool.restarts, during_resync, pool.resent

    plain, restarts, _, _ = run(False)
    faulty, restarts_f, during, resent = run(True)
    assert restarts == 0 and restarts_f == 1
    if pause_others:
        assert during == [(0, True)]  # engine 1 had been paused before the re-sync
    else:
        assert len(during) == 1 and during[0][0] > 0  # engine 1 still generating during the re-sync
    assert resent > 0  # the in-flight work lost with the dead engine (and the paused one) is counted
    assert faulty == plain
