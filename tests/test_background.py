"""Serving first: the trainer process runs at a lower priority, on its own CPUs, with few threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawrl.background import choose_cpus, choose_threads
from clawrl.config import BackgroundConfig, EngineConfig, StoreConfig, TrainConfig
from clawrl.trainer_process import TrainerProcess
from tests.helpers import wait_until


def test_auto_gives_the_background_the_upper_half_of_the_cpus() -> None:
    assert choose_cpus("auto", {0, 1}) == {1}
    assert choose_cpus("auto", {0, 1, 2, 3, 4}) == {2, 3, 4}
    assert choose_cpus("auto", {3}) == {3}  # one CPU: nothing to keep apart, the priority still applies
    assert choose_cpus("all", {0, 1, 2}) == {0, 1, 2}
    assert choose_cpus("1,3-5", {0, 1, 2, 3}) == {1, 3}  # only CPUs this process may use


def test_a_cpu_list_naming_no_usable_cpu_is_refused_with_the_usable_ones() -> None:
    usable = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    with pytest.raises(ValueError, match=rf"names no CPU this process may use \(it may use {usable}\)"):
        BackgroundConfig(background_cpus="4000-4001")
    with pytest.raises(ValueError, match="not a CPU or a range"):
        BackgroundConfig(background_cpus="2-1")


def test_threads_never_outnumber_the_cores_the_background_may_use() -> None:
    config = BackgroundConfig()
    assert choose_threads(config, None, {2, 3}, {0, 1, 2, 3}) == 2  # its own CPUs: one thread each
    assert choose_threads(config, None, {0, 1, 2, 3}, {0, 1, 2, 3}) == 2  # shared with serving: half
    assert choose_threads(config, None, {0}, {0}) == 1
    assert choose_threads(config, 3, {2, 3}, {0, 1, 2, 3}) == 3  # --cpu-threads wins
    assert choose_threads(BackgroundConfig(background_threads=5), 3, {2}, {0, 1, 2}) == 5


def _thread_postures(pid: int) -> set[tuple[int, str]]:
    """(nice, allowed CPUs) of every thread of a process, from /proc."""
    postures = set()
    for thread_id in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{thread_id}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{thread_id}/status").read_text()
        except FileNotFoundError:  # a thread that just ended
            continue
        nice = int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of stat, counted after the command name
        cpus = next(line.split(":")[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        postures.add((nice, cpus))
    return postures


def test_the_trainer_process_runs_behind_serving(tiny_model_dir: Path, tmp_path: Path) -> None:
    last_cpu = max(os.sched_getaffinity(0))
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    configs = (EngineConfig(model=str(tiny_model_dir), device="cpu"), StoreConfig(run_dir=tmp_path),
               TrainConfig(method="combine", train_poll_s=0.1),
               BackgroundConfig(background_nice=6, background_cpus=str(last_cpu)))  # fmt: skip
    with TrainerProcess(*configs) as trainer:
        pid = trainer.pid
        wait_until(lambda: (tmp_path / "trainer.lock").exists(), 60, "the trainer holding its run directory")
        time.sleep(2.0)  # its model loaded and torch's threads started
        assert trainer.running()
        assert _thread_postures(pid) == {(min(19, own_nice + 6), str(last_cpu))}


def test_numpys_blas_threads_step_back_with_torchs() -> None:
    """OpenBLAS starts a thread per core of the machine at numpy's import; pinned to fewer cores they
    spin against each other (the judge's classifier took 17 s instead of 1.2 s to build)."""
    last_cpu = max(os.sched_getaffinity(0))
    script = ("import json, numpy; from threadpoolctl import threadpool_info; from clawrl.background import step_back; "
              f"from clawrl.config import BackgroundConfig; posture = step_back(BackgroundConfig(background_cpus='{last_cpu}')); "
              "print(json.dumps([posture.threads, [pool['num_threads'] for pool in threadpool_info() if pool['user_api'] == 'blas']]))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    threads, blas_pools = json.loads(done.stdout)
    assert threads == 1 and blas_pools and set(blas_pools) == {1}
