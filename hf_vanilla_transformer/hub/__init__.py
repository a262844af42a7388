"""Sharing models on the Hugging Face Hub: one commit with the weights, the model's code, tokenizer,
generation config and a CTranslate2 export (`publishing`), and a model card filled from the run's records
(`model_card`, with its template in `model_cards/`)."""
