// The chat page's third-party code, exposed as window.kvmemVendor (see scripts/build-ui.sh).
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/common";
import { Marked } from "marked";

window.kvmemVendor = { DOMPurify, hljs, Marked };
