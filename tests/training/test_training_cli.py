"""training/cli.py: one command line from the config dataclasses, each setting declared once."""

import argparse
import dataclasses

import pytest

from model.capsnet import CapsNetConfig
from training import cli, finetune, train
from training.config import TrainConfig
from training.experiments import common


def test_every_field_of_the_configs_is_an_option_with_its_comment_as_help():
    for cls in (TrainConfig, CapsNetConfig, finetune.FineTuneConfig):
        p = argparse.ArgumentParser()
        cli.add_options(p, cls)
        options = {a.dest: a for a in p._actions if a.dest != "help"}
        assert set(options) == {f.name for f in dataclasses.fields(cls)}, cls
    helps = cli.field_help(TrainConfig)
    assert helps["max_shift"] == "random shift in pixels, each direction (section 5: 2)"
    # a comment continued on the lines below is one sentence, and section headers (# --- data) are not help
    assert helps["lr_decay"].endswith("is ~0.99 per epoch of 60k; short runs want ~0.9")
    assert helps["precision"].endswith("auto: bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16 / AMX)")
    assert "---" not in "".join(helps.values())


def test_no_options_give_the_configs_defaults_and_options_set_fields():
    assert train.parse_args([]) == (TrainConfig(), CapsNetConfig())
    config, model = train.parse_args(
        ["--lr-decay", "0.9", "--no-reconstruction", "--routing", "em", "--compile", "--data-dir", "somewhere"]
    )
    assert config == dataclasses.replace(TrainConfig(), lr_decay=0.9, compile=True, data_dir="somewhere")
    assert model == CapsNetConfig(routing="em", reconstruction=False)


def test_a_value_outside_the_choices_is_refused(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--routing", "telepathy"])
    assert "invalid choice: 'telepathy'" in capsys.readouterr().err


def test_commands_that_take_a_subset_keep_their_own_defaults():
    args = common.parser("x", "doc", "x", lr_decay=0.95).parse_args([])
    assert common.train_config(args) == TrainConfig(lr_decay=0.95, out="runs/x")
    args = finetune.parse_args(["--font-share", "0.3"])
    assert cli.build(finetune.FineTuneConfig, args) == finetune.FineTuneConfig(font_share=0.3)
    assert cli.build(TrainConfig, args) == TrainConfig(**finetune.TRAIN_DEFAULTS)


def test_an_option_the_config_lacks_is_a_mistake_in_the_command():
    with pytest.raises(ValueError, match="TrainConfig has no option routing"):
        cli.add_options(argparse.ArgumentParser(), TrainConfig, only=["routing"])
