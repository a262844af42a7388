"""What every wing of the package shares, below all of them: command-line arguments and their one-line
refusals (`cli`), the one reader of line-aligned text (`text_lines`), where models, runs and exports keep
their files (`model_location`), a model's weights checked against its config.json before it loads
(`model_weights`), settings declared once as dataclass fields (`settings_schema`), and the
shared BPE vocabulary (`tokenization`)."""
