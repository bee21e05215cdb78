"""The audit's last room, the report: the result value and its JSON (``_result``), and the text the command line
prints, section by section (``_format``)."""
