//! A host's languages: its executors by language tag, and the client's calls
//! that register native functions and executors and list languages.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::native::{NativeExecutor, NativeRegistry};
use super::{ExecutionContext, LanguageExecutor};
use crate::client::Client;
use crate::error::{Error, Result};

/// The local host's languages: its executors by language tag, and the
/// registry of native functions the built-in `native` executor resolves.
pub(crate) struct Languages {
    by_language: RwLock<HashMap<String, Arc<dyn LanguageExecutor>>>,
    natives: Arc<NativeRegistry>,
}

impl Languages {
    /// The client's languages (made on first use, with the built-in
    /// `native` executor).
    pub fn of(client: &Client) -> &Languages {
        let slot = client
            .0
            .local
            .languages
            .get_or_init(|| Box::new(Languages::new()));
        match slot.downcast_ref::<Languages>() {
            Some(languages) => languages,
            // Only this function fills the slot.
            None => unreachable!("a client's language slot holds its languages"),
        }
    }

    fn new() -> Languages {
        let natives = Arc::new(NativeRegistry::default());
        let mut by_language: HashMap<String, Arc<dyn LanguageExecutor>> = HashMap::new();
        by_language.insert(
            crate::program::LANGUAGE_NATIVE.to_string(),
            Arc::new(NativeExecutor(natives.clone())),
        );
        Languages {
            by_language: RwLock::new(by_language),
            natives,
        }
    }
    pub fn register(&self, language: &str, executor: Arc<dyn LanguageExecutor>) -> Result<()> {
        if language.is_empty() {
            return Err(Error::invalid_argument(
                "a language executor needs a language tag",
            ));
        }
        if language == crate::program::LANGUAGE_COLOCATED {
            return Err(Error::already_exists(
                "the 'colocated' language is built in",
            ));
        }
        let mut map = self.by_language.write().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(language) {
            return Err(Error::already_exists(format!(
                "an executor for '{language}' programs is already registered"
            )));
        }
        map.insert(language.to_string(), executor);
        Ok(())
    }

    pub fn get(&self, language: &str) -> Option<Arc<dyn LanguageExecutor>> {
        self.by_language
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(language)
            .cloned()
    }

    /// The languages, sorted.
    pub fn languages(&self) -> Vec<String> {
        let mut languages: Vec<String> = self
            .by_language
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .chain([crate::program::LANGUAGE_COLOCATED.to_string()])
            .collect();
        languages.sort();
        languages
    }

    /// Every registered executor (built-in ones included).
    pub fn all(&self) -> Vec<Arc<dyn LanguageExecutor>> {
        self.by_language
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

impl Client {
    /// Adds `func` to the local host's registry of native functions under `name`.
    /// Fails with `already_exists` if the name is taken.
    pub fn register_native_function(
        &self,
        name: &str,
        func: impl Fn(&mut ExecutionContext<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        Languages::of(self).natives.register(name, Arc::new(func))
    }

    /// Lets the local host run programs of `language` (an SDK registers `python`).
    /// Fails with `already_exists` if the language has an executor.
    pub fn register_executor(&self, language: &str, executor: impl LanguageExecutor) -> Result<()> {
        Languages::of(self).register(language, Arc::new(executor))
    }

    /// The program languages host `host` runs (sorted), e.g. `["native"]`.
    pub fn languages(&self, host: usize) -> Result<Vec<String>> {
        if host >= self.hosts().len() {
            return Err(Error::invalid_argument(format!(
                "host {host} is out of range ({} hosts)",
                self.hosts().len()
            )));
        }
        Ok(match self.remote(host) {
            Some(remote) => remote.session.host().languages.clone(),
            None => {
                let mut languages = Languages::of(self).languages();
                // A host with a PJRT plugin's devices runs XLA programs (its
                // executor is registered when the first one is compiled).
                let xla = crate::program::LANGUAGE_XLA;
                let has_plugin = self.0.hosts[host]
                    .device_ids()
                    .iter()
                    .any(|id| self.lookup_device(*id).is_ok_and(|d| d.0.pjrt.is_some()));
                if has_plugin && !languages.iter().any(|l| l == xla) {
                    languages.push(xla.to_string());
                    languages.sort();
                }
                languages
            }
        })
    }
}
