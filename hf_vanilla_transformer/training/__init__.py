"""Training, from data to a scored model: the paper's recipe (Section 5) on transformers' Seq2SeqTrainer
(`pipeline.run_training`), its presets (`presets`), token-budget batches (`batching`), local and Hub data
(`data`), BPE-dropout (`subword_dropout`), back-translation (`backtranslation`), the label-smoothed loss
(`loss`), Adam with Eq. 3's schedule (`schedule`), resuming (`resume`), checkpoint averaging
(`averaging`), early stopping (`early_stopping`), progress lines (`progress`) and the final report
(`run_report`); and the Korean chatbot of the Keras tutorial, trained through the same parts (`chatbot`)."""
