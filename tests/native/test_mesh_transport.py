"""The mesh transport on its own, two ranks as two threads: authentication, link choice, timeouts, dead peers."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hora import _native

from tests.pages import huge_pages_possible, on_pages

SECRET = b"s" * 32
F32 = _native.DataType.FLOAT32
SUM = _native.ReduceOp.SUM
HUGE = huge_pages_possible()  # whether buffers on huge pages pass by reference here (tests/pages.py)


# The three ways a message crosses between two ranks: by reference through shared memory, through the
# shared ring, and over TCP.
EVERY_LINK = pytest.mark.parametrize(
    ("hosts", "single_copy"),
    [([0, 0], True), ([0, 0], False), ([0, 1], False)],
    ids=["shm-by-reference", "shm-through-the-ring", "tcp"],
)


# The tests of single copy's workings pass buffers of a few MiB by reference: from 2 MiB, not from the core's 32
# (shm_link.h), which only test_only_messages_of_buffers_larger_than_the_caches_pass_by_reference keeps.
SMALL_BUFFERS = 2 << 20


def connect_pair(
    secrets: tuple[bytes, bytes] = (SECRET, SECRET),
    timeout: float = 5.0,
    hosts: Sequence[int] = (),
    shared_memory: tuple[bool, bool] = (True, True),
    single_copy: tuple[bool, bool] = (True, True),
    single_copy_buffer_bytes: tuple[int, int] | None = (SMALL_BUFFERS, SMALL_BUFFERS),
) -> list[object]:
    """Connects ranks 0 and 1 from two threads; returns each transport or exception.

    Single copy starts at ``single_copy_buffer_bytes`` (None: the core's own threshold).
    """
    thresholds = single_copy_buffer_bytes
    options = [{"single_copy_buffer_bytes": n} for n in thresholds] if thresholds is not None else [{}, {}]
    listeners = [_native.TcpListener("127.0.0.1", 0) for _ in range(2)]
    peers = [("127.0.0.1", listener.port) for listener in listeners]
    results: list[object] = [None, None]

    def body(rank: int) -> None:
        try:
            results[rank] = _native.connect(
                listeners[rank], rank, peers, secrets[rank], 2.0, timeout, list(hosts), shared_memory[rank],
                single_copy[rank], **options[rank],
            )  # fmt: skip
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for listener in listeners:
        listener.close()
    return results


def on_both(transports: list[object], body: Callable[[object, int], object]) -> list[object]:
    """Runs body(transport, rank) on both ranks at once; returns each result or exception."""
    results: list[object] = [None, None]

    def run(rank: int) -> None:
        try:
            results[rank] = body(transports[rank], rank)
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.timeout(30)
def test_connection_with_another_secret_is_refused(capfd: pytest.CaptureFixture[str]) -> None:
    acceptor, connector = connect_pair((SECRET, b"x" * 32))
    assert isinstance(connector, _native.HoraInternalError)
    assert "Rank 1 could not connect to rank 0" in str(connector)
    assert isinstance(acceptor, _native.HoraInternalError)
    assert "Rank 0 timed out after 2 s waiting for connections from ranks 1." in str(acceptor)
    assert "rank 0 rejected a connection from 127.0.0.1" in capfd.readouterr().err


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("hosts", "shared_memory", "link"),
    [
        ([0, 0], (True, True), "shm"),
        ([0, 1], (True, True), "tcp"),
        ([], (True, True), "tcp"),
        ([0, 0], (False, True), "tcp"),  # either side turning it off is enough
        ([0, 0], (True, False), "tcp"),
    ],
)
def test_pairs_on_one_host_share_memory_unless_either_side_declines(
    hosts: list[int], shared_memory: tuple[bool, bool], link: str
) -> None:
    transports = connect_pair(hosts=hosts, shared_memory=shared_memory)
    assert [t.links() for t in transports] == [["self", link], [link, "self"]]
    shm = link == "shm"  # and then large messages pass by reference (both "ranks" are this process: always allowed)
    assert [t.single_copy() for t in transports] == [[False, shm], [shm, False]]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("single_copy", [(False, True), (True, False)])
def test_single_copy_needs_both_sides(single_copy: tuple[bool, bool]) -> None:
    transports = connect_pair(hosts=[0, 0], single_copy=single_copy)
    assert [t.links() for t in transports] == [["self", "shm"], ["shm", "self"]]
    assert [t.single_copy() for t in transports] == [[False, False], [False, False]]


@pytest.mark.timeout(30)
def test_a_pair_that_would_pass_by_reference_from_different_buffer_sizes_fails_naming_both() -> None:
    """Both sides must know which messages come by reference (shm_link.h): thresholds that differ fail the set-up."""
    errors = connect_pair(hosts=[0, 0], single_copy_buffer_bytes=(2 << 20, 4 << 20))
    assert all(isinstance(e, _native.HoraInternalError) for e in errors), errors
    assert "from buffers of 2097152 bytes and the peer from 4194304" in str(errors[0])
    assert "from buffers of 4194304 bytes and the peer from 2097152" in str(errors[1])
    assert "every rank must give the same single_copy_buffer_bytes" in str(errors[0])
    # Without single copy on either side, the threshold is never used and need not agree.
    transports = connect_pair(hosts=[0, 0], single_copy=(False, True), single_copy_buffer_bytes=(2 << 20, 4 << 20))
    assert [t.links() for t in transports] == [["self", "shm"], ["shm", "self"]]


@pytest.mark.timeout(60)
@EVERY_LINK
def test_large_odd_messages_cross_intact(hosts: list[int], single_copy: bool) -> None:
    transports = connect_pair(hosts=hosts, single_copy=(single_copy, single_copy))
    assert transports[0].single_copy() == [False, single_copy]
    # Several times the ring, an odd number of 2-byte elements, then a
    # one-byte broadcast that leaves the stream at an odd position.
    inputs = [(np.arange(2_500_001) % 1000 * (r + 1)).astype(np.float16) for r in range(2)]

    def body(transport, rank):
        data = on_pages(inputs[rank], huge=True)
        _native.allreduce(transport, data, _native.DataType.FLOAT16, SUM)
        tail = np.array([rank + 7], np.uint8)
        _native.broadcast(transport, tail, 1)
        again = np.full(1001, rank + 1.0, np.float32)
        _native.allreduce(transport, again, F32, SUM)
        # Blocks of four full segments and a 4 KiB one: small messages queued behind large ones.
        mixed = on_pages(np.arange(MIXED, dtype=np.float32) * (rank + 1), huge=True)
        _native.allreduce(transport, mixed, F32, SUM)
        # An Average with a postscale factor, which the last reduction applies as it reads (transport.h).
        averaged = on_pages(AVERAGED[rank], huge=True)
        _native.allreduce(transport, averaged, F32, _native.ReduceOp.AVERAGE, 1.0, 0.3)
        return data, tail, again, mixed, averaged

    results = on_both(transports, body)
    expected = inputs[0] + inputs[1]
    for data, tail, again, mixed, averaged in results:
        np.testing.assert_array_equal(data, expected)
        assert tail.tolist() == [8]
        assert again.tolist() == [3.0] * 1001
        np.testing.assert_array_equal(mixed, np.arange(MIXED, dtype=np.float32) * 3)
        # Each element is one float32 sum of the two ranks' values (in either order), then times float32(0.3 / 2).
        np.testing.assert_array_equal(averaged, (AVERAGED[0] + AVERAGED[1]) * np.float32(0.3 / 2))
    # By reference (the buffers are on huge pages): the 9 whole segments of each of the big allreduce's two blocks a
    # rank sends, and the 4 of each of the mixed one's and of the Average's; their last, shorter segments go through
    # the ring, as do the 4 KiB ones.
    sent = 34 * (single_copy and HUGE)
    assert [t.sent_by_reference() for t in transports] == [[0, sent], [sent, 0]]


@pytest.mark.timeout(60)
@EVERY_LINK
def test_an_allreduce_into_an_output_reads_its_input_where_it_lies(hosts: list[int], single_copy: bool) -> None:
    """Out of place, each link reduces the peer's message with this rank's input into the output (transport.h's
    `own`): by reference, through the shared ring and through TCP staging, the bits of an in-place allreduce."""
    transports = connect_pair(hosts=hosts, single_copy=(single_copy, single_copy))
    cases = [(AVERAGED, F32, _native.ReduceOp.AVERAGE, 0.3),
             ([(np.arange(2_500_001) % 1000 * (r + 1)).astype(np.float16) for r in range(2)], _native.DataType.FLOAT16,
              SUM, 1.0)]  # fmt: skip

    def body(transport, rank):
        outcomes = []
        for inputs, dtype, op, postscale in cases:
            in_place, source = on_pages(inputs[rank], huge=True), on_pages(inputs[rank], huge=True)
            output = on_pages(np.zeros_like(source), huge=True)
            _native.allreduce(transport, in_place, dtype, op, 1.0, postscale)
            _native.allreduce(transport, source, dtype, op, 1.0, postscale, output=output)
            outcomes.append((in_place, source, output))
        return outcomes

    for rank, outcomes in enumerate(on_both(transports, body)):
        assert isinstance(outcomes, list), outcomes  # else the exception that rank raised
        for (inputs, *_), (in_place, source, output) in zip(cases, outcomes, strict=True):
            np.testing.assert_array_equal(output.view(np.uint8), in_place.view(np.uint8))
            np.testing.assert_array_equal(source.view(np.uint8), inputs[rank].view(np.uint8))


MIXED = 2 * (4 * 65_536 + 1_024)  # float32: two blocks of 1 MiB + 4 KiB, a buffer just over 2 MiB
AVERAGED = [np.random.default_rng(r).standard_normal(MIXED).astype(np.float32) for r in range(2)]


@pytest.mark.timeout(60)
def test_only_messages_of_buffers_larger_than_the_caches_pass_by_reference() -> None:
    """Buffers under the last-level cache's size (32 MiB) go through the rings, which are faster there, the more so
    when the ranks' cores do not share that cache; a 32 MiB one passes by reference (shm_link.h)."""
    transports = connect_pair(hosts=[0, 0], single_copy_buffer_bytes=None)

    def body(transport, rank):
        counts = []
        for mib in (16, 32):
            data = on_pages(np.full(mib << 18, rank + 1.0, np.float32), huge=True)
            _native.allreduce(transport, data, F32, SUM)
            assert (data == 3.0).all()
            counts.append(transport.sent_by_reference()[1 - rank])
        before = counts[-1]
        small = on_pages(np.full(16 << 20, rank, np.uint8), huge=True)  # a 16 MiB broadcast: through the ring as well
        _native.broadcast(transport, small, 0)
        large = on_pages(np.full(32 << 20, rank, np.uint8), huge=True)
        _native.broadcast(transport, large, 0)
        assert not small.any() and not large.any()
        counts.append(transport.sent_by_reference()[1 - rank] - before)
        return counts

    # 32 MiB: blocks of 16 MiB, 64 segments each, sent once in the reduce-scatter and once in the allgather;
    # the 32 MiB broadcast's 128 segments are all sent by rank 0.
    assert on_both(transports, body) == ([[0, 128, 128], [0, 128, 0]] if HUGE else [[0, 0, 0], [0, 0, 0]])


@pytest.mark.skipif(_native.on_huge_pages(np.zeros(1, np.uint8)) is None, reason="the kernel cannot tell pages apart")
def test_the_kernel_tells_huge_pages_from_small_ones() -> None:
    data = np.arange(3 << 20, dtype=np.float32)
    assert _native.on_huge_pages(on_pages(data, huge=True)) is HUGE
    assert _native.on_huge_pages(on_pages(data, huge=False)) is False
    assert _native.on_huge_pages(np.zeros(0, np.uint8)) is False
    with pytest.raises(ValueError, match="contiguous"):
        _native.on_huge_pages(on_pages(data, huge=True)[::2])


@pytest.mark.timeout(60)
@pytest.mark.skipif(_native.on_huge_pages(np.zeros(1, np.uint8)) is None, reason="the kernel cannot tell pages apart")
def test_each_writer_passes_by_reference_only_from_huge_pages() -> None:
    """Rank 0's buffers lie on huge pages, rank 1's on 4 KiB pages, where the kernel's page pinning costs more than the
    copy it saves (huge_pages.h): in one allreduce, rank 0's large messages cross by reference and rank 1's through
    the ring, each announced by a header, and the sums are exact. Then the other way round."""
    transports = connect_pair(hosts=[0, 0])
    inputs = [(np.arange(3 << 20) % 1001 * (r + 1)).astype(np.float32) for r in range(2)]  # 12 MiB: 48 segments
    expected = inputs[0] + inputs[1]

    def body(transport, rank):
        counts = []
        for huge_rank in (0, 1):
            data = on_pages(inputs[rank], huge=rank == huge_rank)
            _native.allreduce(transport, data, F32, SUM)
            np.testing.assert_array_equal(data, expected)
            counts.append(transport.sent_by_reference()[1 - rank])
        return counts

    # Blocks of 6 MiB, 24 segments each, which a rank sends once in the reduce-scatter and once in the allgather.
    assert on_both(transports, body) == [[48, 48], [0, 48]]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hosts", [[0, 0], [0, 1]], ids=["shm", "tcp"])
def test_silent_peer_times_out_and_breaks_the_transport(hosts: list[int]) -> None:
    first, _second = connect_pair(timeout=0.5, hosts=hosts)
    data = np.ones(1000, np.float32)
    with pytest.raises(_native.HoraInternalError, match=r"no data moved for 0.5 s .* rank 1 \(127\.0\.0\.1:\d+\)"):
        _native.allreduce(first, data, F32, SUM)
    # Broken from now on: later requests fail at once with the same cause.
    with pytest.raises(_native.HoraInternalError, match=r"no data moved for 0\.5 s"):
        _native.barrier(first)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hosts", [[0, 0], [0, 1]], ids=["shm", "tcp"])
def test_aborting_peer_fails_the_other_at_once(hosts: list[int]) -> None:
    first, second = connect_pair(timeout=20.0, hosts=hosts)
    timer = threading.Timer(0.3, second.abort, args=("rank 1 gave up",))
    timer.start()
    try:
        with pytest.raises(_native.HoraInternalError, match="Rank 0 lost its connection to rank 1"):
            _native.allreduce(first, np.ones(4_000_000, np.float32), F32, SUM)
    finally:
        timer.join()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 3])
def test_stray_connections_to_a_peer_port_do_not_delay_the_mesh(size: int, capfd: pytest.CaptureFixture[str]) -> None:
    """Idle, trickling, lying and too-many connections to rank 0's port, and a flood while the real ranks connect: the
    mesh forms (handshakes run side by side, silent strays are evicted first, a genuine connection that was evicted
    anyway connects again; before, each idle stray held the port for 10 s and the job failed)."""
    listeners = [_native.TcpListener("127.0.0.1", 0) for _ in range(size)]
    peers = [("127.0.0.1", listener.port) for listener in listeners]
    strays = [socket.create_connection(peers[0]) for _ in range(70)]  # more than the acceptor keeps waiting
    strays[-2].sendall(b"HORATCP1")  # starts a handshake and stops
    strays[-1].sendall(b"HORATCP1" + bytes(8 + 32 + 32))  # a complete handshake with a forged proof
    results: list[object] = [None] * size

    def body(rank: int) -> None:
        try:
            results[rank] = _native.connect(listeners[rank], rank, peers, SECRET, 8.0, 5.0)
        except Exception as exc:
            results[rank] = exc

    connected = threading.Event()

    def flood() -> None:  # more strays keep coming while the ranks connect
        for _ in range(300):
            if connected.is_set():
                return
            with contextlib.suppress(OSError):
                strays.append(socket.create_connection(peers[0], timeout=0.2))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    flooder = threading.Thread(target=flood)
    for t in [*threads, flooder]:
        t.start()
    for t in threads:
        t.join(30)
    connected.set()
    flooder.join(30)
    for stray in strays:
        stray.close()
    for listener in listeners:
        listener.close()
    assert all(isinstance(t, _native.MeshTransport) for t in results), results
    err = capfd.readouterr().err
    assert "rank 0 rejected a connection from 127.0.0.1" in err
    assert "authentication failed" in err  # the forged proof was read and refused, not waited out
    assert "evicted" in err
