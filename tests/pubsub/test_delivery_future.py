"""DeliveryFuture behaves as a running concurrent.futures.Future, races included."""

from __future__ import annotations

import random
import threading
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait

import pytest

from bolide.facade.producer.future import DeliveryFuture


def test_is_a_running_future_that_cannot_be_cancelled() -> None:
    future = DeliveryFuture()
    assert isinstance(future, Future)
    assert future.running() and not future.done()
    assert future.cancel() is False
    assert not future.cancelled()
    assert "running" in repr(future)


def test_resolves_without_building_a_condition() -> None:
    future = DeliveryFuture()
    future.set_result(7)
    assert future._cond is None  # the cheap path: nobody asked before the result came
    assert future.done() and future.result() == 7 and future.exception() is None
    assert future._cond is None


def test_waiter_in_another_thread_is_woken() -> None:
    future = DeliveryFuture()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(future.result(timeout=5)))
    waiter.start()
    while future._cond is None:  # the waiter built the condition and is waiting on it
        threading.Event().wait(0.001)
    future.set_result(42)
    waiter.join(5)
    assert got == [42]


def test_failure_reaches_result_exception_and_callbacks() -> None:
    future = DeliveryFuture()
    seen: list[BaseException | None] = []
    future.add_done_callback(lambda f: seen.append(f.exception()))
    error = RuntimeError("broker said no")
    future.set_exception(error)
    with pytest.raises(RuntimeError, match="broker said no"):
        future.result()
    assert future.exception() is error
    assert seen == [error]


def test_done_callbacks_run_once_before_and_after_resolution() -> None:
    future = DeliveryFuture()
    calls: list[int] = []
    future.add_done_callback(lambda f: calls.append(f.result()))
    future.set_result(3)
    future.add_done_callback(lambda f: calls.append(f.result() * 10))
    assert calls == [3, 30]


def test_wait_and_as_completed_see_mixed_futures() -> None:
    done_early = DeliveryFuture()
    done_early.set_result(1)
    later = DeliveryFuture()
    timer = threading.Timer(0.05, later.set_result, args=(2,))
    timer.start()
    finished, pending = wait([done_early, later], timeout=5, return_when=FIRST_COMPLETED)
    assert done_early in finished
    finished, pending = wait([done_early, later], timeout=5)
    assert not pending and {f.result() for f in finished} == {1, 2}
    assert sorted(f.result() for f in as_completed([done_early, later], timeout=5)) == [1, 2]
    timer.join()


def test_racing_waiters_and_resolvers_never_miss_a_result() -> None:
    """Resolve many futures while other threads wait in every way a caller can."""
    count = 2_000
    futures = [DeliveryFuture() for _ in range(count)]
    errors: list[str] = []
    callbacks = [0]
    lock = threading.Lock()

    def on_done(_f: Future[int]) -> None:
        with lock:
            callbacks[0] += 1

    def resolver() -> None:
        for i, f in enumerate(futures):
            f.set_result(i)

    def result_waiter(seed: int) -> None:
        rng = random.Random(seed)
        for i in rng.sample(range(count), 300):
            if futures[i].result(timeout=10) != i:
                errors.append(f"result {i}")

    def wait_waiter(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(30):
            chunk = rng.sample(futures, 20)
            _, pending = wait(chunk, timeout=10)
            if pending:
                errors.append("wait left futures pending")

    def callback_adder(seed: int) -> None:
        rng = random.Random(seed)
        for i in rng.sample(range(count), 300):
            futures[i].add_done_callback(on_done)

    threads = [
        threading.Thread(target=result_waiter, args=(1,)),
        threading.Thread(target=wait_waiter, args=(2,)),
        threading.Thread(target=callback_adder, args=(3,)),
        threading.Thread(target=resolver),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert callbacks[0] == 300
    assert [f.result() for f in futures] == list(range(count))
