"""foxcute.lab.sanitize's command line (the sanitizer runs themselves need the GPU machine)."""

from foxcute.lab import sanitize


def test_an_unknown_layer_is_refused_before_any_kernel_runs(capsys):
    assert sanitize.main(["mamba2", "mamba3"]) == 2
    assert "unknown layer(s) ['mamba3']" in capsys.readouterr().err
