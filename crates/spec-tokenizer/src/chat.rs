//! Chat templates: the model's Jinja template rendered with `minijinja`.
//!
//! The environment follows the one chat templates are written for (Hugging Face's
//! `apply_chat_template`): `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the
//! template dropped, undefined variables falsy (so `{% if tools %}` works without tools), Python
//! string/dict/list methods (`.strip()`, `.items()`, …) through `minijinja-contrib`'s pycompat
//! layer, loop controls, and a `raise_exception(message)` function.

use std::fmt;

use minijinja::{Environment, Error as JinjaError, ErrorKind, context};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TokenizerError};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (or `tool`).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

const NAME: &str = "chat_template";

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] with the position of the syntax error.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(template_error)?;
        Ok(Self {
            env,
            source: source.to_owned(),
        })
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`. `bos_token` / `eos_token` are the values of the template variables
    /// of those names.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] if rendering fails (including `raise_exception` calls, e.g. a
    /// template that rejects the order of roles).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        let template = self.env.get_template(NAME).map_err(template_error)?;
        template
            .render(context! {
                messages => minijinja::value::Serde(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => bos_token,
                eos_token => eos_token,
            })
            .map_err(template_error)
    }
}

fn raise_exception(message: String) -> std::result::Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

fn template_error(e: JinjaError) -> TokenizerError {
    // `{:#}` includes the template position and the failing source line.
    TokenizerError::Template(format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_trimmed_like_transformers_does() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\n",
        )
        .expect("compiles");
        let out = t
            .render(
                &[Message::user("a"), Message::system("x"), Message::user("b")],
                false,
                "",
                "",
            )
            .expect("renders");
        assert_eq!(out, "[a]\n[b]\n");
    }

    #[test]
    fn python_methods_loop_controls_and_variables_work() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}\
             {{ m['content'].strip().upper() }}|{% endfor %}{% if add_generation_prompt %}{{ eos_token }}{% endif %}",
        )
        .expect("compiles");
        let msgs = [
            Message::user("  hi "),
            Message::user("skip"),
            Message::user("yo\n"),
        ];
        assert_eq!(
            t.render(&msgs, true, "<s>", "</s>").expect("renders"),
            "<s>HI|YO|</s>"
        );
        assert_eq!(t.render(&msgs, false, "", "").expect("renders"), "HI|YO|");
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_reported() {
        let t =
            ChatTemplate::new("{{ raise_exception('roles must alternate') }}").expect("compiles");
        let err = t.render(&[], false, "", "").expect_err("raises");
        assert!(err.to_string().contains("roles must alternate"), "{err}");
        let err = ChatTemplate::new("{% for %}").expect_err("bad syntax");
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
    }
}
