"""--profile-steps: TensorFlow's profile of chosen training steps, into the TensorBoard logs."""
import pytest

from pipelines.training.config import TrainConfig, profile_range


@pytest.mark.parametrize("text, wanted", [("", 0), ("  ", 0), ("5,8", (5, 8)), ("3", (3, 3)), (" 2 , 2 ", (2, 2))])
def test_the_steps_become_kerass_profile_batch(text, wanted):
    assert profile_range(text) == wanted
    assert TrainConfig(data="d", output="o", profile_steps=text).outputs.profile_batch == wanted


@pytest.mark.parametrize("text, why", [("0,3", "integers >= 1"), ("a", "integers >= 1"), ("1,2,3", "integers >= 1"),
                                       ("-1", "integers >= 1"), ("3,2", "FIRST must not exceed LAST")])
def test_bad_steps_are_one_line_exit_2(text, why, capsys):
    from pipelines.runtime.config import parse_configs
    from pipelines.launch.config import LaunchConfig
    with pytest.raises(SystemExit) as info:
        parse_configs((TrainConfig, LaunchConfig), ["--data", "d", "--output", "o", "--profile-steps", text])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--profile-steps {text}: " + ("give FIRST,LAST training steps (integers >= 1), e.g. 10,15"
                                                       if why.startswith("integers") else why)), err
    assert err.count("\n") == 0


def test_a_profile_needs_the_tensorboard_logs():
    with pytest.raises(ValueError, match="drop --no-tensorboard"):
        TrainConfig(data="d", output="o", profile_steps="2,3", tensorboard=False)
