"""`GenerationStream`: how an engine's thread hands token steps to the consumer's event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from clawrl.engines.base import GenerationStream, TokenStep


def counting_wake_ups(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Count the loop's wake-ups from other threads (`call_soon_threadsafe`)."""
    calls = [0]
    original = loop.call_soon_threadsafe

    def counted(*args: object, **kwargs: object) -> asyncio.Handle:
        calls[0] += 1
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    return calls


def produce(stream: GenerationStream, count: int, pause_s: float = 0.0) -> threading.Thread:
    def run() -> None:
        for index in range(count):
            time.sleep(pause_s)  # an engine's decode step: the consumer catches up meanwhile
            stream.push(TokenStep(index, -1.0, finish_reason="length" if index == count - 1 else None))
        stream.finish()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_steps_from_another_thread_arrive_all_and_in_order() -> None:
    async def main() -> list[int]:
        stream = GenerationStream(0)
        thread = produce(stream, 20_000)
        received = [step.token_id async for step in stream]
        thread.join()
        return received

    assert asyncio.run(main()) == list(range(20_000))


def test_a_held_stream_wakes_its_loop_once_at_the_end_with_every_step() -> None:
    async def main() -> tuple[list[int], int, str | None]:
        stream = GenerationStream(0)
        wake_ups = counting_wake_ups(asyncio.get_running_loop())
        stream.hold_until_done()
        thread = produce(stream, 200, pause_s=0.0005)
        received = [step.token_id async for step in stream]
        thread.join()
        return received, wake_ups[0], stream.finish_reason

    received, wake_ups, finish_reason = asyncio.run(main())
    assert received == list(range(200)) and finish_reason == "length"
    assert wake_ups <= 2  # the last step and `finish`, which may share one


def test_a_failure_reaches_a_held_consumer() -> None:
    async def main() -> None:
        stream = GenerationStream(0)
        stream.hold_until_done()
        stream.push(TokenStep(1, -1.0))
        stream.fail(RuntimeError("the engine's worker died"))
        async for _ in stream:
            pass

    with pytest.raises(RuntimeError, match="worker died"):
        asyncio.run(main())


def test_putting_into_a_stream_whose_loop_is_closed_raises() -> None:
    """The hf engine reads the RuntimeError as "nobody will read this stream" and stops generating,
    also when the loop closed with a wake-up still pending (which then never runs)."""

    async def new_stream() -> GenerationStream:
        return GenerationStream(0)

    def in_another_thread(push: Callable[[], None]) -> BaseException | None:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                push()
            except BaseException as error:  # noqa: BLE001 - handed back to the test
                errors.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return errors[0] if errors else None

    loop = asyncio.new_event_loop()
    stream = loop.run_until_complete(new_stream())
    assert in_another_thread(lambda: stream.push(TokenStep(1, -1.0))) is None  # a wake-up the loop will never run
    loop.close()
    error = in_another_thread(lambda: stream.push(TokenStep(2, -1.0)))
    assert isinstance(error, RuntimeError) and "closed" in str(error)


def test_a_producer_on_the_consumers_own_loop_needs_no_wake_up() -> None:
    """The remote engine reads its server's stream on the serving loop: no self-pipe write per token."""

    async def main() -> tuple[list[int], int]:
        stream = GenerationStream(0)
        wake_ups = counting_wake_ups(asyncio.get_running_loop())

        async def produce_here() -> None:
            for index in range(50):
                await asyncio.sleep(0)
                stream.push(TokenStep(index, -1.0))
            stream.finish()

        producer = asyncio.ensure_future(produce_here())
        received = [step.token_id async for step in stream]
        await producer
        return received, wake_ups[0]

    received, wake_ups = asyncio.run(main())
    assert received == list(range(50)) and wake_ups == 0
