"""The stage applications' log lines (pipeline/log.py): `LEVEL [stage] message` on stderr,
`[stage] message` for progress on stdout, whichever module logs them."""

from __future__ import annotations

import logging

from pipeline import log


def test_each_line_names_the_stage_and_goes_where_print_put_it(capsys):
    log.setup("tokenize")
    logger = logging.getLogger("pipeline.anything")
    logger.info("done: %s", "{}")
    logger.log(log.NOTE, "window read this stage's outputs: no longer complete")
    logger.warning("skipping corpus file file:///c/a 100%.txt")
    logger.error("corpus file %s is empty", "file:///c/b.txt")
    logger.debug("not shown")
    captured = capsys.readouterr()
    assert captured.out == "[tokenize] done: {}\n"
    assert captured.err == (
        "NOTE [tokenize] window read this stage's outputs: no longer complete\n"
        "WARNING [tokenize] skipping corpus file file:///c/a 100%.txt\n"
        "ERROR [tokenize] corpus file file:///c/b.txt is empty\n"
    )


def test_a_second_setup_names_another_stage_without_doubling_the_lines(capsys):
    log.setup("tokenize")
    log.setup("window")
    logger = logging.getLogger("spark_jobs.window")
    logger.warning("a file is short")
    logger.warning("could not write x", extra={"stage": "train"})
    assert capsys.readouterr().err == "WARNING [window] a file is short\nWARNING [train] could not write x\n"


def test_printable_escapes_what_a_terminal_takes_as_commands_and_keeps_text_and_line_ends():
    assert log.printable("\x1b[2J\x07\x00\x7f\x9b\x85 hark\rthee") == "\\x1b[2J\\x07\\x00\\x7f\\x9b\\x85 hark\\x0dthee"
    text = "Ἀχιλῆος, said\tshe,\nand line ends\r\nstay — “as typed” 論語"
    assert log.printable(text) == text
