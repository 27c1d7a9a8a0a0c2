"""``--ft-inprocess-respawn`` and ``--ft-respawn-timeout``: parsed into the launcher's options,
off by default, and a bad timeout is refused by the parser with the flag named.

The respawn itself (a SIGKILLed rank respawned alone and healed by its Wrapper) runs with the
Wrapper installed: tests/integration/test_inprocess_respawn.py.
"""

from __future__ import annotations

import pytest

from resiliency.launcher import build_parser
from resiliency.launcher.options import LauncherOptions


def _options(*flags: str) -> LauncherOptions:
    return LauncherOptions.from_args(build_parser().parse_args([*flags, "train.py"]))


def test_respawn_is_off_by_default() -> None:
    options = _options()
    assert options.inprocess_respawn is False
    assert options.respawn_timeout == 60.0


def test_the_flags_turn_it_on_with_their_timeout() -> None:
    options = _options("--ft-inprocess-respawn", "--ft-respawn-timeout", "7.5")
    assert options.inprocess_respawn is True
    assert options.respawn_timeout == 7.5


def test_a_negative_timeout_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _options("--ft-respawn-timeout", "-1")
    assert "--ft-respawn-timeout" in capsys.readouterr().err
