

def test_plain_values_take_the_c_pickler_and_everything_else_cloudpickle():
    """Scalars and small containers of them skip cloudpickle (every control call pays for it);
    a lambda, a tensor or a deep/long container still go through cloudpickle and round-trip."""
    import pickle

    import torch

    from rlmesh.transport.serialization import _plain, dumps, loads

    plain = ((1, "a", None, 2.5, b"x", True), {"k": [1, 2], "d": {"n": 3}})
    assert _plain(plain)
    assert dumps(plain) == [pickle.dumps(plain, protocol=5)]
    assert loads(dumps(plain)) == plain
    square = lambda v: v * v  # noqa: E731 - by value: only cloudpickle can send it
    t = torch.arange(4)
    for other in (((square,), {}), ((t,), {}), ((list(range(17)),), {}), (((((1,),),),), {})):
        assert not _plain(other)
    assert loads(dumps(((square,), {})))[0][0](3) == 9
    assert torch.equal(loads(dumps(((t,), {})))[0][0], t)
    assert loads(dumps(((list(range(17)),), {}))) == ((list(range(17)),), {})
