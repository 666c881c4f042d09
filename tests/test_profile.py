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
