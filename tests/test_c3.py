"""The strict-majority engine on synthetic signatures."""

from scout_sys.consensus import c3


def test_all_equal_is_agree_common_mode():
    v = c3.vote({0: "a", 1: "a", 2: "a", 3: "a"})
    assert v.status == c3.AGREE
    assert v.majority == (0, 1, 2, 3) and v.minority == ()
    assert v.signature == "a"


def test_single_outlier_is_attributed():
    v = c3.vote({0: "wait", 1: "wait", 2: "sleep", 3: "wait"})
    assert v.status == c3.ATTRIBUTED
    assert v.minority == (2,)
    assert v.majority == (0, 1, 3)
    assert v.signature == "wait"


def test_tie_is_inconclusive():
    v = c3.vote({0: "a", 1: "a", 2: "b", 3: "b"})
    assert v.status == c3.INCONCLUSIVE
    assert v.minority == () and v.signature is None


def test_plurality_is_not_majority():
    # 3 of 7 is the largest group but not more than half.
    sigs = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "d"}
    assert c3.vote(sigs).status == c3.INCONCLUSIVE


def test_two_ranks_disagreeing_have_no_majority():
    assert c3.vote({0: "wait", 1: "sleep"}).status == c3.INCONCLUSIVE
    assert c3.vote({0: "wait", 1: "wait"}).status == c3.AGREE


def test_several_outliers_with_different_signatures():
    sigs = {r: "wait" for r in range(8)}
    sigs[3] = "sleep"
    sigs[6] = "stopped"
    v = c3.vote(sigs)
    assert v.status == c3.ATTRIBUTED
    assert v.minority == (3, 6)


def test_bare_majority_and_bare_tie():
    five = {0: "a", 1: "a", 2: "a", 3: "b", 4: "c"}
    assert c3.vote(five).minority == (3, 4)
    assert c3.vote({0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}).status == c3.INCONCLUSIVE


def test_none_is_a_signature_like_any_other():
    v = c3.vote({0: None, 1: None, 2: "x"})
    assert v.status == c3.ATTRIBUTED and v.minority == (2,) and v.signature is None


def test_empty():
    assert c3.vote({}).status == c3.INCONCLUSIVE


def test_8192_ranks():
    sigs = {r: ("waiting", "all_reduce", "train.py:42") for r in range(8192)}
    for r in (17, 4000, 8191):
        sigs[r] = ("idle", "loader")
    v = c3.vote(sigs)
    assert v.status == c3.ATTRIBUTED
    assert v.minority == (17, 4000, 8191)
    assert len(v.majority) == 8189
    half = {r: ("a" if r < 4096 else "b") for r in range(8192)}
    assert c3.vote(half).status == c3.INCONCLUSIVE


def test_strict_majority_is_more_than_half_and_a_tie_is_not():
    from scout_sys.consensus.c3 import strict_majority

    assert strict_majority(3, 4) and strict_majority(2, 3) and strict_majority(1, 1)
    assert not strict_majority(2, 4) and not strict_majority(0, 0) and not strict_majority(1, 3)


def test_majority_size_is_the_fewest_that_are_a_strict_majority():
    for n in range(1, 64):
        k = c3.majority_size(n)
        assert c3.strict_majority(k, n) and not c3.strict_majority(k - 1, n)
