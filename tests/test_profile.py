"""foxcute.lab.profile's command line (profiling itself needs the GPU machine)."""

from foxcute.lab import benchmarks, profile


def test_list_names_every_case(capsys):
    assert profile.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [case.name for case in benchmarks.CASES]


def test_an_unknown_case_or_implementation_is_refused_before_any_launch(capsys):
    assert profile.main(["mamba2.sideways"]) == 2
    assert "unknown case 'mamba2.sideways'" in capsys.readouterr().err
    assert profile.main(["mamba2.backward", "--impl", "cute_warp_drive"]) == 2
    assert "has no implementation 'cute_warp_drive'" in capsys.readouterr().err
    assert profile.main(["mamba2.backward", "--calls", "0"]) == 2
    assert "--calls must be >= 1" in capsys.readouterr().err


def test_host_profile_names_where_a_calls_time_goes():
    from foxcute.lab import torch_ops

    def inner_work():
        return sum(range(2000))

    def one_call():
        return inner_work()

    table = torch_ops.host_profile(one_call, calls=50, warmup=2, top=5)
    assert "inner_work" in table and "50" in table  # the function, called 50 times while profiled


def test_host_profile_refuses_an_unknown_pass_before_any_launch(capsys):
    import pytest

    from foxcute.lab import torch_ops

    with pytest.raises(SystemExit) as exit_info:
        torch_ops.main(["--profile", "curiosity_sideways"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown passes ['curiosity_sideways']" in err and "curiosity_forward_backward" in err
