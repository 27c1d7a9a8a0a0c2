"""wrap_callables and restore_original_callables."""

from __future__ import annotations

import types

import pytest

from resiliency.straggler import CallableId, Detector, DetectorStateError, StragglerConfigError


class Base:
    def inherited(self, x: int) -> int:
        return x + 1


class Model(Base):
    def forward(self, x: int) -> int:
        return x * 2

    @staticmethod
    def helper(x: int) -> int:
        return x - 1

    @classmethod
    def build(cls, x: int) -> str:
        return f"{cls.__name__}{x}"


def test_wrapped_callables_are_timed_and_restored_exactly() -> None:
    Detector.initialize()
    originals = {name: Model.__dict__.get(name) for name in ("forward", "helper", "build")}
    model = Model()
    module = types.ModuleType("data")
    module.load = lambda n: list(range(n))  # type: ignore[attr-defined]
    Detector.wrap_callables(
        [
            CallableId(Model, "forward", ignored_args=("self",)),
            CallableId(Model, "helper"),
            CallableId(Model, "build", ignored_args=("x",)),
            CallableId(Model, "inherited"),
            CallableId(module, "load"),
        ]
    )
    for _ in range(3):
        assert model.forward(2) == 4
        assert Model.helper(2) == 1 and model.helper(2) == 1
        assert Model.build(1) == "Model1"
        assert model.inherited(1) == 2
        assert module.load(2) == [0, 1]
    counts = {n: s.count for n, s in Detector.generate_report().local_section_summaries.items()}
    # Sections of a class's methods carry the class's module, as in NVIDIA's resiliency
    # extension (issue 10; formerly "Model.forward").
    prefix = f"{Model.__module__}.Model"
    assert counts == {
        f"{prefix}.forward": 3,
        f"{prefix}.helper": 6,
        f"{prefix}.build": 3,
        f"{prefix}.inherited": 3,
        "data.load": 3,
    }
    Detector.restore_original_callables()
    for name, original in originals.items():
        assert Model.__dict__.get(name) is original
    assert "inherited" not in Model.__dict__
    assert model.forward(3) == 6 and Model.build(2) == "Model2"
    assert Detector.generate_report().local_section_summaries == {}


def test_a_method_wrapped_on_an_instance_stays_bound_to_it() -> None:
    Detector.initialize()
    model, other = Model(), Model()
    Detector.wrap_callables([CallableId(model, "forward", ignored_args=("self",))])
    assert model.forward(2) == 4 and model.forward(5) == 10
    assert other.forward(1) == 2  # only that instance is timed
    counts = {n: s.count for n, s in Detector.generate_report().local_section_summaries.items()}
    assert counts == {"Model.forward": 2}
    Detector.restore_original_callables()
    assert "forward" not in vars(model) and model.forward(3) == 6


def test_shutdown_restores_wrapped_callables() -> None:
    original = Model.__dict__["forward"]
    Detector.initialize()
    Detector.wrap_callables([CallableId(Model, "forward")])
    assert Model.__dict__["forward"] is not original
    Detector.shutdown()
    assert Model.__dict__["forward"] is original


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([CallableId(Model, "absent")], "no attribute 'absent'"),
        ([CallableId(Model, "forward", ignored_args=("y",))], r"ignored_args \['y'\]"),
        ([CallableId(Model, "forward"), CallableId(Model, "forward")], "already wrapped"),
        (["Model.forward"], "CallableId objects"),
    ],
)
def test_bad_callable_ids_wrap_nothing(ids: list, message: str) -> None:
    original = Model.__dict__["forward"]
    Detector.initialize()
    with pytest.raises(StragglerConfigError, match=message):
        Detector.wrap_callables(ids)
    assert Model.__dict__["forward"] is original


def test_wrapping_needs_an_initialized_detector() -> None:
    with pytest.raises(DetectorStateError):
        Detector.wrap_callables([CallableId(Model, "forward")])
    Detector.restore_original_callables()  # a no-op, not an error
