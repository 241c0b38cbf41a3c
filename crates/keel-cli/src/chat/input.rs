//! Reading the user's input for `keel chat`: a dedicated thread owns the line editor
//! (reedline: history, multi-line input, Ctrl-C / Ctrl-D) and reads only when asked, so
//! nothing reads the terminal while a turn runs — except an inline approval question, which
//! is asked through the same thread. Without a terminal on stdin, plain lines are read.

use std::borrow::Cow;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::mpsc;

use reedline::{
    FileBackedHistory, Prompt, PromptEditMode, PromptHistorySearch, PromptHistorySearchStatus,
    Reedline, Signal, ValidationResult, Validator,
};
use tokio::sync::oneshot;

/// How many entries the history file keeps.
const HISTORY_CAPACITY: usize = 1000;

/// What one read produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A complete entry (continuation backslashes removed).
    Line(String),
    /// Ctrl-C at the prompt: the line was cleared.
    Interrupted,
    /// Ctrl-D or end of input.
    Eof,
}

/// Which prompt to show.
#[derive(Debug, Clone)]
pub enum Ask {
    /// The chat prompt (`you> `), recorded in the history.
    Chat,
    /// A one-off question (approval, the agent's question), not recorded.
    Question(String),
}

struct Request {
    ask: Ask,
    reply: oneshot::Sender<Input>,
}

/// A handle to the input thread (cheap to clone).
#[derive(Clone)]
pub struct InputHandle {
    sender: mpsc::Sender<Request>,
}

impl std::fmt::Debug for InputHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InputHandle")
    }
}

impl InputHandle {
    /// Starts the input thread. `history` is the history file (its directory is created);
    /// when it cannot be used the session runs without history and says so.
    pub fn start(history: PathBuf) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("keel-chat-input".into())
            .spawn(move || input_thread(&history, &receiver))?;
        Ok(Self { sender })
    }

    /// Reads one entry. The input thread going away reads as end of input.
    pub async fn read(&self, ask: Ask) -> Input {
        let (reply, answer) = oneshot::channel();
        if self.sender.send(Request { ask, reply }).is_err() {
            return Input::Eof;
        }
        answer.await.unwrap_or(Input::Eof)
    }
}

fn input_thread(history: &std::path::Path, requests: &mpsc::Receiver<Request>) {
    let mut editors = std::io::stdin()
        .is_terminal()
        .then(|| Editors::new(history));
    let mut stdin = std::io::stdin().lock();
    while let Ok(request) = requests.recv() {
        let input = match editors.as_mut() {
            Some(editors) => editors.read(&request.ask),
            None => read_plain(&mut stdin, &request.ask),
        };
        // A dropped receiver only means the asker gave up.
        let _ = request.reply.send(input);
    }
}

/// The two line editors: the chat one (history, multi-line) and a plain one for questions.
struct Editors {
    chat: Reedline,
    question: Reedline,
}

impl Editors {
    fn new(history: &std::path::Path) -> Self {
        let mut chat = Reedline::create().with_validator(Box::new(ContinuationValidator));
        if let Some(parent) = history.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        match FileBackedHistory::with_file(HISTORY_CAPACITY, history.to_path_buf()) {
            Ok(file) => chat = chat.with_history(Box::new(file)),
            Err(error) => eprintln!(
                "keel chat: history disabled ({}: {error})",
                history.display()
            ),
        }
        Self {
            chat,
            question: Reedline::create(),
        }
    }

    fn read(&mut self, ask: &Ask) -> Input {
        let (editor, prompt) = match ask {
            Ask::Chat => (&mut self.chat, ChatPrompt::chat()),
            Ask::Question(text) => (&mut self.question, ChatPrompt::question(text)),
        };
        match editor.read_line(&prompt) {
            Ok(Signal::Success(line)) => {
                if matches!(ask, Ask::Chat) {
                    // Write the entry to the history file now (reedline only writes on drop,
                    // and the process may exit without dropping the editor).
                    if let Err(error) = editor.sync_history() {
                        eprintln!("keel chat: cannot write the history file: {error}");
                    }
                }
                Input::Line(join_continuations(&line))
            }
            Ok(Signal::CtrlC) => Input::Interrupted,
            Ok(Signal::CtrlD) => Input::Eof,
            Ok(_) => Input::Interrupted,
            Err(error) => {
                eprintln!("keel chat: cannot read the terminal: {error}");
                Input::Eof
            }
        }
    }
}

/// Reads lines without a terminal; a line ending with `\` continues on the next one.
fn read_plain(stdin: &mut impl BufRead, ask: &Ask) -> Input {
    let prompt = match ask {
        Ask::Chat => "you> ".to_string(),
        Ask::Question(text) => text.clone(),
    };
    print!("{prompt}");
    let _ = std::io::stdout().flush();
    let mut entry = String::new();
    loop {
        let mut line = String::new();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) if entry.is_empty() => {
                println!();
                return Input::Eof;
            }
            Ok(0) | Err(_) => return Input::Line(join_continuations(&entry)),
            Ok(_) => {}
        }
        let line = line.trim_end_matches(['\n', '\r']);
        // Echo the entry so a transcript reads like the terminal session.
        println!("{line}");
        entry.push_str(line);
        if !ends_with_continuation(line) {
            return Input::Line(join_continuations(&entry));
        }
        entry.push('\n');
        print!("...> ");
        let _ = std::io::stdout().flush();
    }
}

/// Whether a line asks to continue on the next one (ends with a single `\`).
pub fn ends_with_continuation(line: &str) -> bool {
    line.ends_with('\\') && !line.ends_with("\\\\")
}

/// Removes the continuation backslashes of a multi-line entry.
pub fn join_continuations(entry: &str) -> String {
    entry
        .split('\n')
        .map(|line| {
            if ends_with_continuation(line) {
                line.strip_suffix('\\').unwrap_or(line)
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Entries whose last line ends with `\` are incomplete: Enter adds a line.
struct ContinuationValidator;

impl Validator for ContinuationValidator {
    fn validate(&self, line: &str) -> ValidationResult {
        let last = line.rsplit('\n').next().unwrap_or(line);
        if ends_with_continuation(last) {
            ValidationResult::Incomplete
        } else {
            ValidationResult::Complete
        }
    }
}

/// The prompt: `you> ` (continuation lines `...> `), or a question.
struct ChatPrompt {
    left: String,
}

impl ChatPrompt {
    fn chat() -> Self {
        Self {
            left: "you> ".into(),
        }
    }

    fn question(text: &str) -> Self {
        Self { left: text.into() }
    }
}

impl Prompt for ChatPrompt {
    fn render_prompt_left(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.left)
    }

    fn render_prompt_right(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn render_prompt_indicator(&self, _mode: PromptEditMode) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn render_prompt_multiline_indicator(&self) -> Cow<'_, str> {
        Cow::Borrowed("...> ")
    }

    fn render_prompt_history_search_indicator(&self, search: PromptHistorySearch) -> Cow<'_, str> {
        let prefix = match search.status {
            PromptHistorySearchStatus::Passing => "",
            PromptHistorySearchStatus::Failing => "failing ",
        };
        Cow::Owned(format!("({prefix}reverse-search: {}) ", search.term))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_lines_join() {
        assert!(ends_with_continuation("first \\"));
        assert!(!ends_with_continuation("path C:\\\\"));
        assert_eq!(join_continuations("first \\\nsecond"), "first \nsecond");
        assert_eq!(join_continuations("one line"), "one line");
    }

    #[test]
    fn plain_reading_handles_continuations_and_eof() {
        let mut input = std::io::Cursor::new("a \\\nb\nc\n");
        assert_eq!(
            read_plain(&mut input, &Ask::Chat),
            Input::Line("a \nb".into())
        );
        assert_eq!(read_plain(&mut input, &Ask::Chat), Input::Line("c".into()));
        assert_eq!(read_plain(&mut input, &Ask::Chat), Input::Eof);
    }
}
