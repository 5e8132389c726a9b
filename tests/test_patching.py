"""nrl_shim.patching's layers on one object's method (wrap_instance / unwrap_instance / is_instance_wrapped), as the
refit fixes use them on a model's load_weights: each quirk's layer is its own whatever order they are added and
removed in, wrapping is idempotent per quirk id, a foreign wrapper over ours is never rewritten, and once every layer
is off the object is as it was (the class's method shows through, or its own attribute is back). A plain Python class
stands in for the model: the mechanism reads nothing of vLLM's."""

import copy
import functools
import itertools
import pickle

import pytest

from nrl_shim.patching import is_instance_wrapped, is_wrapped, unwrap, unwrap_instance, wrap, wrap_instance

IDS = ("quirk-a", "quirk-b", "quirk-c")


class Model:
    def __init__(self):
        self.calls = []

    def load_weights(self, weights):
        """Load weights."""
        self.calls.append(weights)
        return len(self.calls)


def recording(quirk_id, seen):
    """A layer that notes its quirk id on each call, then calls what it wraps."""

    def wrapper(wrapped, instance, args, kwargs):
        seen.append((quirk_id, instance))
        return wrapped(*args, **kwargs)

    return wrapper


def test_one_layer_on_one_object_only():
    model, other, seen = Model(), Model(), []
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")
    assert model.load_weights("w") == 1 and seen == [("quirk-a", model)] and model.calls == ["w"]
    assert "load_weights" not in vars(other) and not is_instance_wrapped(other, "load_weights", "quirk-a")
    assert is_instance_wrapped(model, "load_weights", "quirk-a")
    assert not is_instance_wrapped(model, "load_weights", "quirk-b")
    assert model.load_weights.__doc__ == "Load weights." and model.load_weights.__name__ == "load_weights"
    unwrap_instance(model, "load_weights", "quirk-a")
    assert "load_weights" not in vars(model) and not is_instance_wrapped(model, "load_weights", "quirk-a")
    assert model.load_weights.__func__ is Model.load_weights


def test_wrapping_again_keeps_one_layer_and_takes_the_new_wrapper():
    model, seen = Model(), []
    wrap_instance(model, "load_weights", recording("old", seen), "quirk-a")
    layer = vars(model)["load_weights"]
    wrap_instance(model, "load_weights", recording("new", seen), "quirk-a")
    assert vars(model)["load_weights"] is layer
    model.load_weights("w")
    assert seen == [("new", model)]
    unwrap_instance(model, "load_weights", "quirk-a")
    unwrap_instance(model, "load_weights", "quirk-a")  # twice: nothing more to do
    assert "load_weights" not in vars(model)


@pytest.mark.parametrize("order", list(itertools.permutations(IDS)))
def test_every_removal_order_leaves_the_others_and_ends_with_the_class_method(order):
    model, seen = Model(), []
    for quirk_id in IDS:
        wrap_instance(model, "load_weights", recording(quirk_id, seen), quirk_id)
    model.load_weights("w")
    assert [quirk_id for quirk_id, _ in seen] == list(reversed(IDS))  # the last one added runs first
    left = list(IDS)
    for quirk_id in order:
        unwrap_instance(model, "load_weights", quirk_id)
        left.remove(quirk_id)
        seen.clear()
        model.load_weights("w")
        assert [q for q, _ in seen] == list(reversed(left)), (order, quirk_id)
        assert {q for q in IDS if is_instance_wrapped(model, "load_weights", q)} == set(left)
    assert "load_weights" not in vars(model)
    assert model.load_weights.__func__ is Model.load_weights and model.calls == ["w"] * (len(IDS) + 1)


@pytest.mark.parametrize("order", list(itertools.permutations(IDS)))
def test_every_removal_order_gives_back_the_objects_own_attribute(order):
    model, seen = Model(), []

    def own(weights):  # someone's instance attribute, there before any layer
        return "own"

    model.load_weights = own
    for quirk_id in IDS:
        wrap_instance(model, "load_weights", recording(quirk_id, seen), quirk_id)
    assert model.load_weights("w") == "own" and len(seen) == 3
    for quirk_id in order:
        unwrap_instance(model, "load_weights", quirk_id)
    assert vars(model)["load_weights"] is own


def test_a_layer_under_another_is_a_pass_through_and_wrapping_again_enables_it():
    model, seen = Model(), []
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")
    wrap_instance(model, "load_weights", recording("quirk-b", seen), "quirk-b")
    unwrap_instance(model, "load_weights", "quirk-a")  # under quirk-b's: stays, as a pass-through
    model.load_weights("w")
    assert [q for q, _ in seen] == ["quirk-b"]
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")  # enabled again, in its place
    seen.clear()
    model.load_weights("w")
    assert [q for q, _ in seen] == ["quirk-b", "quirk-a"]
    unwrap_instance(model, "load_weights", "quirk-b")  # the top one: off, and quirk-a's runs alone
    seen.clear()
    model.load_weights("w")
    assert [q for q, _ in seen] == ["quirk-a"]


def test_a_foreign_wrapper_over_ours_is_kept_and_ours_becomes_a_pass_through():
    model, seen = Model(), []
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")
    ours = model.load_weights

    @functools.wraps(ours)
    def tracer(*args, **kwargs):  # a profiler's, set after ours: it holds ours and we can't rewrite it
        seen.append(("tracer", None))
        return ours(*args, **kwargs)

    model.load_weights = tracer
    unwrap_instance(model, "load_weights", "quirk-a")
    assert vars(model)["load_weights"] is tracer and not is_instance_wrapped(model, "load_weights", "quirk-a")
    model.load_weights("w")
    assert [q for q, _ in seen] == ["tracer"] and model.calls == ["w"]
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")  # found under the tracer: enabled
    assert vars(model)["load_weights"] is tracer and is_instance_wrapped(model, "load_weights", "quirk-a")
    seen.clear()
    model.load_weights("w")
    assert [q for q, _ in seen] == ["tracer", "quirk-a"]


def test_a_layer_added_over_a_foreign_wrapper_comes_off_to_it():
    model, seen = Model(), []
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")
    ours = model.load_weights
    tracer = functools.wraps(ours)(lambda *args, **kwargs: ours(*args, **kwargs))
    model.load_weights = tracer
    wrap_instance(model, "load_weights", recording("quirk-b", seen), "quirk-b")
    unwrap_instance(model, "load_weights", "quirk-b")
    assert vars(model)["load_weights"] is tracer
    model.load_weights("w")
    assert [q for q, _ in seen] == ["quirk-a"]


def test_a_copy_taken_while_on_stops_calling_the_removed_layer():
    model, seen = Model(), []
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")
    taken = model.load_weights
    unwrap_instance(model, "load_weights", "quirk-a")
    taken("w")
    assert seen == [] and model.calls == ["w"]


def test_copies_and_pickles_of_the_object_carry_no_layer():
    model, seen = Model(), []
    wrap_instance(model, "load_weights", recording("quirk-a", seen), "quirk-a")
    for duplicate in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert not is_instance_wrapped(duplicate, "load_weights", "quirk-a")
        duplicate.load_weights("w")
        assert seen == [] and duplicate.calls == ["w"] and model.calls == []  # the copy's own method, not ours


def test_missing_method_and_objects_without_a_dict_are_errors():
    with pytest.raises(AttributeError):
        wrap_instance(Model(), "no_such_method", recording("quirk-a", []), "quirk-a")
    with pytest.raises(TypeError):
        wrap_instance(1, "bit_length", recording("quirk-a", []), "quirk-a")
    unwrap_instance(Model(), "load_weights", "quirk-a")  # never wrapped: nothing to do
    assert not is_instance_wrapped(1, "bit_length", "quirk-a")


def test_a_layer_on_an_inherited_method_calls_the_bases_method_as_it_is_at_call_time():
    # activate() re-applies fixes in registry order, so a subclass's layer can come back before a layer on its base:
    # the subclass's layer must reach the base's current method, not a copy taken when it was added.
    class Base:
        def load(self, x):
            return ["base", x]

    class Sub(Base):
        pass

    def tag(label):
        def wrapper(wrapped, instance, args, kwargs):
            return [label, *wrapped(*args, **kwargs)]

        return wrapper

    wrap(Base, "load", tag("base-fix"), "base-fix")
    wrap(Sub, "load", tag("sub-fix"), "sub-fix")
    assert Sub().load(1) == ["sub-fix", "base-fix", "base", 1]
    unwrap(Sub, "load", "sub-fix")
    unwrap(Base, "load", "base-fix")
    assert "load" not in vars(Sub) and Sub().load(1) == ["base", 1]
    wrap(Sub, "load", tag("sub-fix"), "sub-fix")  # the subclass first this time
    wrap(Base, "load", tag("base-fix"), "base-fix")
    assert Sub().load(1) == ["sub-fix", "base-fix", "base", 1]
    assert is_wrapped(Sub, "load", "base-fix")  # seen through the subclass's layer, so it is not added twice
    wrap(Sub, "load", tag("base-fix"), "base-fix")
    assert Sub().load(1) == ["sub-fix", "base-fix", "base", 1]
    unwrap(Base, "load", "base-fix")
    assert Sub().load(1) == ["sub-fix", "base", 1]
    unwrap(Sub, "load", "sub-fix")
    assert "load" not in vars(Sub) and Sub().load(2) == ["base", 2]
