"""PEFT adapters (``PeftModel.save_pretrained`` output): LoRA A/B pairs with their config."""
