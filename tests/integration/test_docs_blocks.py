"""Every fenced code block in README.md and docs/ (benchmark pages included) runs as written: each
names its language (``python``, ``bash``, ``text`` for diagrams and sample output, or ``yaml``),
and a yaml block is a config file every command takes. ``test_docs_python_blocks.py`` compiles
and runs the python blocks, ``test_docs_bash_blocks.py`` checks the bash blocks' commands."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

import yaml

from tests.integration.doc_blocks import BLOCKS, LANGUAGES, YAML, Block, by_place


@by_place(BLOCKS)
def test_every_block_names_its_language(block: Block) -> None:
    assert block.language in LANGUAGES, (
        f"{block.where}: tag the block with one of {sorted(LANGUAGES)}, not {block.language!r}"
    )


@by_place(YAML)
def test_yaml_blocks_are_config_files_every_command_takes(block: Block) -> None:
    """Every YAML block is an ``epd --config`` file: each command finds its keys flags of its
    own or of another command, and parses their values (required flags aside)."""
    from epd.cli import COMMANDS, add_config_argument, is_flag_of_another_command
    from epd.common.config_file import config_arguments

    document = yaml.safe_load(block.code)
    for command, (module_name, _) in COMMANDS.items():
        parser = argparse.ArgumentParser(exit_on_error=False)
        importlib.import_module(module_name).add_arguments(parser)
        add_config_argument(parser)
        for action in parser._actions:
            action.required = False
        arguments = config_arguments(
            document,
            command,
            parser,
            commands=COMMANDS,
            environ={},
            is_flag_elsewhere=lambda key, command=command: is_flag_of_another_command(command, key),
        )
        parser.parse_args(arguments)
