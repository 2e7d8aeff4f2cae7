"""xlnet-lite: XLNet pretraining and finetuning as a Hugging Face transformers plugin."""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .collator import DataCollatorForXLNetPretraining
from .configuration_xlnet_lite import XLNetLiteConfig
from .convert import from_hf_xlnet, to_hf_xlnet
from .data import (
    PretrainingStream,
    build_eval_batches,
    embedded_news_texts,
    embedded_rotten_tomatoes,
    read_text_documents,
    tokenize_documents,
)
from .modeling_xlnet_lite import (
    XLNetLiteCache,
    XLNetLiteForMultipleChoice,
    XLNetLiteForQuestionAnswering,
    XLNetLiteForQuestionAnsweringSimple,
    XLNetLiteForSequenceClassification,
    XLNetLiteForTokenClassification,
    XLNetLiteLMHeadModel,
    XLNetLiteModel,
    XLNetLitePreTrainedModel,
)
from .tokenization_xlnet_lite import load_tokenizer, train_tokenizer

__version__ = "0.1.0"

AutoConfig.register("xlnet_lite", XLNetLiteConfig, exist_ok=True)
AutoModel.register(XLNetLiteConfig, XLNetLiteModel, exist_ok=True)
AutoModelForCausalLM.register(XLNetLiteConfig, XLNetLiteLMHeadModel, exist_ok=True)
AutoModelForSequenceClassification.register(XLNetLiteConfig, XLNetLiteForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(XLNetLiteConfig, XLNetLiteForTokenClassification, exist_ok=True)
AutoModelForMultipleChoice.register(XLNetLiteConfig, XLNetLiteForMultipleChoice, exist_ok=True)
# as transformers maps XLNet: the Auto class gives the simple head; the SQuAD 2.0 head is loaded by its class
AutoModelForQuestionAnswering.register(XLNetLiteConfig, XLNetLiteForQuestionAnsweringSimple, exist_ok=True)

# save_pretrained writes the code and an auto_map, so saved folders load with trust_remote_code=True
# where xlnet_lite is not installed.
XLNetLiteConfig.register_for_auto_class()
XLNetLiteModel.register_for_auto_class("AutoModel")
XLNetLiteLMHeadModel.register_for_auto_class("AutoModelForCausalLM")
XLNetLiteForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
XLNetLiteForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
XLNetLiteForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
XLNetLiteForQuestionAnsweringSimple.register_for_auto_class("AutoModelForQuestionAnswering")
# a saved SQuAD 2.0 head maps AutoModelForQuestionAnswering (with trust_remote_code) to itself
XLNetLiteForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")

__all__ = [
    "XLNetLiteConfig",
    "XLNetLitePreTrainedModel",
    "XLNetLiteModel",
    "XLNetLiteLMHeadModel",
    "XLNetLiteForSequenceClassification",
    "XLNetLiteForTokenClassification",
    "XLNetLiteForMultipleChoice",
    "XLNetLiteForQuestionAnsweringSimple",
    "XLNetLiteForQuestionAnswering",
    "XLNetLiteCache",
    "from_hf_xlnet",
    "to_hf_xlnet",
    "train_tokenizer",
    "load_tokenizer",
    "DataCollatorForXLNetPretraining",
    "PretrainingStream",
    "build_eval_batches",
    "tokenize_documents",
    "read_text_documents",
    "embedded_news_texts",
    "embedded_rotten_tomatoes",
]
