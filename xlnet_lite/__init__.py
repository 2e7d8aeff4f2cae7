"""xlnet-lite: XLNet pretraining and finetuning as a Hugging Face transformers plugin."""

from transformers import (
    AttentionInterface,
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
from .data import PretrainingStream, TextFileDocuments, build_eval_batches, read_text_documents, tokenize_documents
from .modeling_xlnet_lite import (
    TRITON_ATTENTION,
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
from .objectives import DataCollatorForXLNetCausalLM, DataCollatorForXLNetMaskedLM
from .token_store import TokenStore, write_token_store
from .tokenization_xlnet_lite import load_tokenizer, train_tokenizer

__version__ = "0.1.0"


def _triton_attention_for_xlnet_lite_only(module, *args, **kwargs):
    raise ValueError(
        f"attn_implementation='{TRITON_ATTENTION}' is XLNet-Lite's own relative attention kernel; "
        f"{type(module).__name__} cannot use it"
    )


# Each class with its Auto class. As transformers maps XLNet, AutoModelForQuestionAnswering gives the simple span
# head; the SQuAD 2.0 head is loaded by its class (a saved one maps AutoModelForQuestionAnswering to itself for
# trust_remote_code). save_pretrained writes the code and an auto_map, so saved folders load with
# trust_remote_code=True where xlnet_lite is not installed.
_AUTO_CLASSES = [
    (AutoModel, XLNetLiteModel),
    (AutoModelForCausalLM, XLNetLiteLMHeadModel),
    (AutoModelForSequenceClassification, XLNetLiteForSequenceClassification),
    (AutoModelForTokenClassification, XLNetLiteForTokenClassification),
    (AutoModelForMultipleChoice, XLNetLiteForMultipleChoice),
    (AutoModelForQuestionAnswering, XLNetLiteForQuestionAnsweringSimple),
]
AutoConfig.register("xlnet_lite", XLNetLiteConfig, exist_ok=True)
XLNetLiteConfig.register_for_auto_class()
for _auto, _model in _AUTO_CLASSES:
    _auto.register(XLNetLiteConfig, _model, exist_ok=True)
    _model.register_for_auto_class(_auto.__name__)
XLNetLiteForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
# attn_implementation="xlnet_lite_triton" (the fused Triton kernels) passes transformers' check of the name; the
# models dispatch on it themselves, so the function registered only refuses other models.
AttentionInterface.register(TRITON_ATTENTION, _triton_attention_for_xlnet_lite_only)

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
    "DataCollatorForXLNetMaskedLM",
    "DataCollatorForXLNetCausalLM",
    "PretrainingStream",
    "build_eval_batches",
    "tokenize_documents",
    "read_text_documents",
    "TextFileDocuments",
    "TokenStore",
    "write_token_store",
]
