"""The figures of the README: training curves, the positional encodings, the learning rate and attention
maps (`plotting`; `vanilla-transformer figures` draws them)."""
